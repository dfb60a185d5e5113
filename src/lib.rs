//! turnstile: a rate-limit service for Envoy, a drop-in for envoyproxy/ratelimit.
//!
//! Envoy's ratelimit filter calls `ShouldRateLimit` with a domain and descriptors. The gRPC
//! adapter (`transport`) hands the request to [`service::RateLimiter`], which validates it,
//! matches each descriptor against the limit tree (`descriptor`) and plans an op for every
//! limit that applies: a counter key, its hash, the limit's parameters and the hits. The
//! `limiter` engine sends the ops to the shard actors owning their keys (the hash picks one of
//! N); a shard decides the ops of a message together, and a request refused anywhere consumes
//! nothing anywhere, except usage reported after the fact (`hits_addend`), which counts in full.
//! Counting rules are pure functions of the time, which is a parameter (`limiter::Clock`).
//!
//! # The house
//!
//! Modules form layers and every arrow points down. The "uses" column is what the code imports
//! (`crate::…`), checked by `scripts/check-house.py`, which also refuses a cycle between
//! modules or between the files of one module:
//!
//! | module | what it holds | uses |
//! |---|---|---|
//! | `main.rs`, `cli` | the command line: `serve`, `check`, the binary named `ratelimit` or `limitador-server`, and the settings, telemetry and `server::run` with a shutdown future | `config`, `quota`, `settings`, `telemetry` |
//! | `server` | one `Context` built at start, each adapter handed the parts it uses; listeners, worker runtimes, the side thread (the other ports, reloads, the heavy hitters' tick, the statsd push), the durable counters' journal on a thread of its own, TLS, lingering close, the wait while the start waits, drain | `config`, `durable`, `hitters`, `limiter`, `quota`, `service`, `settings`, `source`, `store`, `telemetry`, `transport` |
//! | `settings` | the one reader of the environment: one grammar for booleans, durations, numbers and addresses, a plain typed struct for each subsystem; Limitador's command line mapped onto them | `config`, `durable`, `hitters`, `limiter`, `service`, `source`, `store`, `telemetry`, `transport` |
//! | `source` | where configs come from: files polled by fingerprint, the xDS client (which builds its last push again when the overlay changes); a stream of `Update`s; the thread of the lowest priority every config is built on | `config` |
//! | `transport` | the adapters: gRPC (`ShouldRateLimit`, RLQS, Kuadrant's `CheckRateLimit` and `Report`), HTTP (`/json`, `/rate`, `/throttle`, health, debug, metrics, the status page, the admin listener, Limitador's API), RESP, what each port answers while the start waits | `config`, `descriptor`, `hitters`, `limiter`, `quota`, `service`, `telemetry` |
//! | `durable` | the durable counters (`TURNSTILE_STATE_DIR`): the journal that saves the shards' changes behind the decisions and reads them back at start; the state files' bytes, a state's included (`format`) | `limiter`, `telemetry` |
//! | `store` | the stores shared by replicas, behind `limiter`'s store contract: Redis (connections, what the store is and whether it runs scripts, key layout, scripts, reply decoding, its errors' counter), and RLQS's demand exchange over it | `config`, `limiter`, `quota`, `telemetry` |
//! | `quota` | RLQS: buckets onto limits, demand, fair shares, the assignments Envoy enforces; the hub the streams share | `config`, `descriptor`, `limiter`, `service`, `telemetry` |
//! | `service` | a request's way through: validate, plan, engine, answer (Limitador's calls too, `limitador`), and its stats (`metrics`: calls, latency, per-limit stats and series); the live limits and the config loads that replace them (`ReloadStats`); the direct APIs' decisions; admin look-ups and resets | `config`, `descriptor`, `hitters`, `limiter`, `telemetry` |
//! | `telemetry` | the exposition and the push: `Metrics`, implemented by each part that counts in its own module, the registry the Prometheus text and statsd loop over; the latency histogram; logs, traces; how client values leave the process | `config` |
//! | `hitters` | heavy hitters: space-saving lists per limit, behind `/debug/top` and the status page | `config`, `descriptor` |
//! | `limiter` | the engine: algorithms, counter keys, shard actors; a shard is its counters, holds, queues and backing (memory, or a link to a store: round trips, breaker, the ledger of hits the store has not counted yet), and its side of a save (`shard/saving.rs`); the store contract | `config`, `telemetry` |
//! | `descriptor` | limit-tree matching and counter keys' text; Limitador's limits matched by their index and CEL | `config` |
//! | `config` | the validated model (units, calendar windows, algorithms, queues, the tree) from YAML, xDS (with the overlay of turnstile's own fields, `overlay`), GoCC's JSON or Limitador's limits file (CEL compiled, `limitador`); no I/O besides reading the files it is given | nothing |
//!
//! `settings` sits above the subsystems because it fills each one's settings struct, so a
//! subsystem never learns where its values came from (linkerd2-proxy's `app/src/env.rs`).
//! `server` lays the runtimes out for speed: one current-thread runtime per worker, each
//! accepting connections and hosting its share of the shards, so a call whose key lives on its
//! own worker decides synchronously. One more thread, the side thread, serves the debug,
//! Prometheus and admin ports and runs the background tasks; with durable counters, another
//! runs their journal. A door's files, polled or on SIGHUP, are read again through
//! one path (`server/reload.rs`'s `Reload`), and xDS's pushes go live through `server::reload`,
//! which records every load; per-limit stats, bound by stat key, survive them. Each is built beside the config it replaces
//! (`config::LiveConfig`), whose keys, stat keys and lists of limits it shares where they are the
//! same, so a reload holds less than two configs.
//!
//! # Words
//!
//! One word a concept. A word retired for another is listed, with what replaced it, in
//! `scripts/retired-words.txt`, and `scripts/check-words.sh` (run by the test command) refuses
//! it in `src/`.
//!
//! - **counters**: a shard's table of keys and their counting state (`Counters`); the
//!   **durable counters** are the same, saved and read back (`durable`). A part's own numbers
//!   are its **stats** (`ShardStats`, `LinkStats`, `StatusStats`), registered for the exposition
//!   in `telemetry::Registry`; what Prometheus reads are **series**, and statsd's kinds keep
//!   their names (counters and timers).
//! - where counts live: a shard's **backing** is memory alone or a **link** to a **store**
//!   (`limiter`'s `Backing`); the process's **storage** is a setting (`settings::Storage`:
//!   memory, memory made durable, or Redis, picked by `BACKEND_TYPE` or by Limitador's storage
//!   subcommand, `StorageCommand`); a store is a counter place shared by replicas, behind the
//!   contract `limiter::Store` (`store::redis::RedisStore`). "backend" is left only in the
//!   user-facing `BACKEND_TYPE` and the status JSON's `"backend"` key.
//! - **hold**: what a limit with `reserve` keeps back for a call until its report (`Holds`,
//!   `holds.rs`, and Redis's sorted set beside the counter). A message that waits, in a queue
//!   (`Decider::park`) or for the store, is answered later (`Decider::answer_later`: a
//!   synchronous caller waits on the channel left in `Ambient::later`).
//! - **queue**: the FIFO of requests waiting for room (YAML `queue`), a shard's `Queues`; a
//!   request in one is a **waiter** (`TURNSTILE_MAX_WAITERS`), and the process-wide cap on
//!   waiters is the `QueueBudget`. **room** is capacity alone: room in a window, a queue, a
//!   mailbox; a part of the house is a module.
//! - **refund**: hits returned to a counter (a refused request's, a released hold's).
//! - the link's **ledger**: hits decided here the store has not counted yet, local-first or
//!   fallback by its `Mode`; a fallback entry sent once the store is back is **replayed**; the
//!   count a local-first decision rests on is the key's **view**. A **sync** is local-first's
//!   exchange with the store; the durable counters' journal writes a **save** each interval
//!   (`Journal::save`; the setting `TURNSTILE_STATE_SYNC_INTERVAL` and the families
//!   `turnstile_state_sync*` keep the names they were published with).
//! - **joint**: a limit that refuses only when every such limit of the request is over
//!   (`Role::Joint`, `JointGroup`); **quota** is RLQS's (`quota`), but for the user-facing YAML
//!   `quota_mode`, `QUOTA_MODE` and the admin look-up's "quota" role.
//! - which hits of a refused request count is the process's `CountingRule` (`UsageInFull`,
//!   `IfAdmitted`, `Always`), from which the plan draws each op's `Counting` (`Usage`,
//!   `IfAdmitted`, `Always`).
//! - **direct**: the direct APIs alone (`/rate`, `THROTTLE`, RESP); a single Redis reached
//!   without the crate's multiplexer is a **plain** connection (`store/redis/plain.rs`).
//! - **live**: the config in force. `service::Live` is it bound to its limits' stats and heavy
//!   hitters, read and replaced through `LiveLimits`; a build sees it as `config::LiveConfig`,
//!   to share with it what the two have in common.
//! - **admin**: the admin listener (`TURNSTILE_ADMIN_ADDR`) and what it does, look-ups and
//!   resets, each module doing its part in an `admin.rs` of its own (`transport/http`,
//!   `service`, `limiter/shard`, `store/redis`); the shard's also releases a direct API's grant.
//!   The **side thread** (`server/side_thread.rs`) serves that listener with the debug and
//!   Prometheus ports, and runs the background tasks.
//! - the statsd settings are `settings/statsd.rs` (a part's `stats` are not statsd's).
//!
//! Glossed, for words the code keeps:
//!
//! - `Ambient`: what a shard decides within (its clock, its stats, the drain, the answer to a
//!   synchronous caller); the server's context is `Context`. `Delivery`: how a synchronous
//!   caller gets its answer (now, or a channel). `RespReply`: a plain Redis connection's reply
//!   (a shard's answer is the `Reply`).
//! - `Tat`: a token bucket's stored time (theoretical arrival time) and how it is kept.
//! - `lane`: a store connection, one per shard (its index). `head_out`: a queue's head waiter
//!   is out in the store, being decided there. `late`: a local-first key's hits of a fixed
//!   window that ended before their sync went out, sent on their own.
//! - `Scratch`: the states a message's ops would leave, computed once and committed if it is
//!   admitted. `Carried`: what a descriptor counts, worked out once in the plan and carried to
//!   the answer. `Peeking`: a look-up's answer while the store's read is still out.
//! - `spread`: a request whose ops live on several shards. `sticky`: GoCC's `/rate` overrides,
//!   kept for the key once a caller passed them. `book`: RLQS's pure state of streams, buckets
//!   and shares; its `Outbox` is what it asks the caller to send.
//!
//! # The doors
//!
//! Each way in has a file in each layer it needs; `server/doors.rs` builds them from the
//! settings, in one `match`, and the rest of `server` names none. What every door keeps is kept
//! where doors are served, so a door cannot leave it out: the bounds on what a caller sends
//! (`service::within_bounds`, `transport/http/bounds.rs`), client values as the listener shows
//! them (`telemetry::Shown`), its calls, errors, latency and span (`transport/grpc.rs`'s
//! `CallLayer`, `transport/http/calls.rs`, the RESP command loop), one reload path
//! (`server/reload.rs`'s `Followed`), the wait's answers (`transport/waiting.rs`), HTTP read
//! timeouts (`server/http_conn.rs`). `scripts/check-house.py` checks every file named here.
//!
//! | door | settings | config | service | transport |
//! |---|---|---|---|---|
//! | Envoy: `ShouldRateLimit`, `/json` | `settings/mod.rs` | `config/mod.rs` | `service/mod.rs` | `transport/grpc.rs`, `transport/http/json.rs` |
//! | Limitador, as `limitador-server` | `settings/limitador.rs` | `config/limitador/mod.rs` | `service/limitador/mod.rs` | `transport/kuadrant.rs`, `transport/http/limitador.rs` |
//! | GoCC: `/rate` | `settings/mod.rs` | `config/gocc.rs` | `service/rate/mod.rs` | `transport/http/rate.rs` |
//! | ThrottleCrab, redis-cell: `THROTTLE`, `/throttle`, `CL.THROTTLE` | `settings/sections.rs` | (none) | `service/throttle.rs` | `transport/resp/mod.rs`, `transport/http/throttle.rs` |
//! | RLQS | `settings/mod.rs` | `config/mod.rs` | `quota/mod.rs` | `transport/rlqs.rs` |
//! | xDS (config) | `source/xds/mod.rs` | `config/xds/mod.rs` | (none) | `source/xds/client.rs` |
//!
//! Adding a door takes its own files in the layers it needs, one arm where `Doors::build` picks
//! the door (or one field beside the RLS door's, as RLQS and the RESP port are), and one row in
//! `tests/it/server/doors.rs`'s table, which walks every door against every promise.
//!
//! # The walk of one decision
//!
//! One `ShouldRateLimit` decided in memory, on the worker whose shard owns its key, file by file
//! in the order they run; a number is a file's first appearance. `scripts/check-house.py` checks
//! that each file named is called (named in code) by one named before it:
//!
//! - (1) `transport/grpc.rs`: the per-call layer starts its clock and opens the request span,
//!   `telemetry/trace.rs` (2); the service reads the request where it lies in the call's bytes,
//!   `transport/codec/mod.rs` (3).
//! - (4) `service/mod.rs`: `RateLimiter::decide` validates the request, `service/request.rs`
//!   (5), takes the live limits, `service/live.rs` (6), and the domain in them, `config/mod.rs`
//!   (7).
//! - (8) `service/plan.rs`: the limits that apply, matched in `descriptor/mod.rs` (9), each
//!   limit's window from `config/unit.rs` (10), and an op for each: its key hashed in
//!   `limiter/key.rs` (11), its parameters `limiter/algorithm.rs`'s (12), its role and counting
//!   `limiter/op.rs`'s (13).
//! - (14) `limiter/mod.rs`: `Engine::decide` sends the ops as one message,
//!   `limiter/protocol.rs` (15), to the shard owning their key, in place on this thread,
//!   `limiter/same_thread.rs` (16).
//! - (17) `limiter/shard/mod.rs` builds the memory `Decider`: `limiter/shard/decide.rs` (18)
//!   reads the time from `limiter/clock.rs` (19), asks `limiter/shard/queues.rs` (20) whether
//!   anyone waits, reads and writes each key's state in `limiter/shard/counters.rs` (21), stored
//!   in `limiter/shard/table.rs` (22) and counted in `limiter/shard/stats.rs` (23), asks
//!   `limiter/shard/holds.rs` (24) what is held for a limit with `reserve`, judges each op by
//!   (12), and the message by the request's verdict in (15) and (13).
//! - (25) `service/answer.rs`: a status per descriptor, counted in `service/metrics/requests.rs` (26)
//!   and the limit's stats, `service/metrics/limit_stats.rs` (27), offered to the heavy hitters,
//!   `hitters/mod.rs` (28) over `hitters/sketch.rs` (29); a refusal is logged at debug by
//!   `service/refusal.rs` (30).
//! - back in (1): the call and its latency counted under its door, `service/metrics/calls.rs`
//!   (31), its histogram `telemetry/histogram.rs` (32); the answer written by (3), the span
//!   closed by (1).
//!
//! # The walk of a decision through Redis
//!
//! The same `ShouldRateLimit` with `BACKEND_TYPE=redis`: the memory walk's way up to the shard
//! and back from it, and between the two a round trip. What crosses into `store` is the store
//! contract alone, once per pipeline:
//!
//! - (1) `server/context.rs`: at start, `settings::Storage::Redis` becomes a `RedisStore`,
//!   `store/redis/mod.rs` (2), its connections made by `store/redis/connect.rs` (3); the engine,
//!   `limiter/mod.rs` (4), gives each shard a `Backing::Store`: a link,
//!   `limiter/shard/link/mod.rs` (5), with its lane (a connection of its own) and breaker,
//!   `limiter/shard/link/breaker.rs` (6).
//! - (7) `limiter/same_thread.rs`: as in memory, the message reaches the shard,
//!   `limiter/shard/mod.rs` (8), whose `with_decider!` builds the `Decider` over the link,
//!   `limiter/shard/decide.rs` (9); what a link changes is in `limiter/shard/through_store.rs`
//!   (10): `decide_via_store` decides a local-first limit in memory against its ledger,
//!   `limiter/shard/link/ledger/mod.rs` (11); without a store (the breaker open) decides as
//!   the failure mode says; refuses at once a key the over-limit cache knows full (5); else
//!   answers it later (9) and defers it to the link's batch.
//! - (12) `limiter/actor.rs`: the shard's task runs once the calls ready on this thread have
//!   joined the batch, and the link sends it: a round trip, `limiter/shard/link/round_trip.rs`
//!   (13), of every message, refund and sync waiting, each op a `StoreOp` of the contract,
//!   `limiter/store.rs` (14).
//! - (2) `RedisStore::run`: each op becomes a command, `store/redis/scripts/mod.rs` (15)
//!   (`INCRBY`, or a Lua script; a limit with `reserve` by `store/redis/scripts/holds.rs`
//!   (16)), in one pipeline per deployment, `store/redis/lane.rs` (17), packed as RESP by
//!   `store/redis/packed.rs` (18); (3) sends it on the lane's connection (the multiplexer, or
//!   `store/redis/plain.rs` (19)) within the deadline, and `store/redis/decode.rs` (20) reads
//!   each reply into a `StoreReply`.
//! - back in (12): the round trip is done; in (10), `store_done` takes the oldest trip back, the
//!   breaker (6) notes its latency, and `judge_stored` judges each message by the memory path's
//!   rules (9), on Redis's counts: a refused message's counted hits are refunded in the next
//!   pipeline, a full key is remembered in the cache (5), the key's state is kept in
//!   `limiter/shard/counters.rs` (21), and the caller is answered, as in memory.
//!
//! # The walk of a save (durable counters)
//!
//! Once per `TURNSTILE_STATE_SYNC_INTERVAL`, and once more at the stop after the last answer.
//! It crosses from `durable` into `limiter` once, at `Engine::save`, and back once, with the
//! page:
//!
//! - (1) `server/mod.rs` starts the journal's own thread, `server/journal.rs` (2), beside the
//!   workers and the side thread, and stops it with them: it runs the journal's task, and at
//!   the stop, once every call is answered, the last save.
//! - (3) `durable/mod.rs`: `Journal::save` asks the engine for what changed (every key, when the
//!   log has outgrown the snapshot).
//! - (4) `limiter/mod.rs`: `Engine::save` sends `Msg::Save`, `limiter/protocol.rs` (5), asking
//!   for a `limiter/saved.rs` (6) page, to each shard in turn, a page at a time: through its
//!   mailbox to the shard's task, `limiter/actor.rs` (7), which hands it to the shard,
//!   `limiter/same_thread.rs` (8).
//! - (9) `limiter/shard/mod.rs` hands it to `limiter/shard/saving.rs` (10), the shard's side
//!   of a save, which takes the keys evicted since the last save from
//!   `limiter/shard/counters.rs` (11) and walks the changed entries of
//!   `limiter/shard/table.rs` (12) from the page's start, clearing their bits, into a page of
//!   at most 32 768 keys.
//! - (13) `durable/format.rs` encodes each page into checksummed frames, each state's bytes by
//!   `durable/format/state.rs` (14), on the blocking pool; `durable/dir.rs` (15) appends them
//!   to the log and syncs it to disk, or streams them into a new snapshot.
//! - (16) `durable/stats.rs`: the save is counted.
//!
//! At start, `server/context.rs` opens the journal before the server serves: `durable/dir.rs`
//! reads the newest snapshot and its log, and `Engine::restore` puts each key into the shard
//! that owns it, through `limiter/shard/saving.rs`.

pub mod cli;
pub mod config;
pub mod descriptor;
pub mod durable;
pub mod hitters;
pub mod limiter;
pub mod quota;
pub mod server;
pub mod service;
pub mod settings;
pub mod source;
pub mod store;
pub mod telemetry;
pub mod transport;
