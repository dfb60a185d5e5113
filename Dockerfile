# syntax=docker/dockerfile:1
#
# turnstile, as a drop-in image for envoyproxy/ratelimit:
#
#   docker build -t turnstile .
#
# The binary is at /bin/turnstile and, under the name manifests for envoyproxy/ratelimit run,
# /bin/ratelimit (a symlink: invoked as `ratelimit` it serves, configured from the environment).
# The runtime image is distroless: no shell, no package manager, runs as uid 65532.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# BuildKit caches keep the registry and the compiled dependencies between builds.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin turnstile \
    && mkdir -p /out \
    && cp target/release/turnstile /out/turnstile \
    && ln -s turnstile /out/ratelimit

# glibc from the same Debian release the binary was built on.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/ /bin/
# HTTP (/healthcheck, /json), gRPC, debug (/rlconfig, /metrics), Prometheus.
EXPOSE 8080 8081 6070 9090
USER nonroot
ENTRYPOINT ["/bin/turnstile"]
CMD ["serve"]
