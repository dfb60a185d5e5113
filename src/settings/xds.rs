//! The xDS door's settings: the management server, the node, TLS to it (`XDS_*`).

use std::path::PathBuf;
use std::time::Duration;

use tonic::metadata::{Ascii, MetadataKey, MetadataValue};

use super::env::{Env, Result};
use crate::config::LoadOptions;
use crate::source::xds::{ClientIdentity, XdsSettings, XdsTls};

/// `None` when `CONFIG_TYPE` is `FILE` (the default), the xDS settings when it is
/// `GRPC_XDS_SOTW`; unset variables take the reference's defaults. Every value set is checked
/// either way.
pub(super) fn xds(env: &Env<'_>) -> Result<Option<XdsSettings>> {
    let on = env.choice(
        "CONFIG_TYPE",
        false,
        &[("FILE", false), ("GRPC_XDS_SOTW", true)],
    )?;
    let headers = env.pairs("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS")?;
    for (k, v) in &headers {
        if MetadataKey::<Ascii>::from_bytes(k.as_bytes()).is_err()
            || MetadataValue::<Ascii>::try_from(v.as_str()).is_err()
        {
            return Err(format!(
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: \"{k}: {v}\" is not a valid header"
            ));
        }
    }
    let backoff_initial = env.duration(
        "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
        Duration::from_secs(10),
    )?;
    let backoff_max = env.duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL", Duration::from_secs(60))?;
    if backoff_initial.is_zero() || backoff_max < backoff_initial {
        return Err(format!(
            "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL ({}) must be more than 0 and at most \
             XDS_CLIENT_BACKOFF_MAX_INTERVAL ({})",
            env.written("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", backoff_initial),
            env.written("XDS_CLIENT_BACKOFF_MAX_INTERVAL", backoff_max)
        ));
    }
    let backoff_jitter = if env.flag("XDS_CLIENT_BACKOFF_JITTER", true)? {
        env.fraction("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", 0.5)?
    } else {
        0.0
    };
    let max_message_bytes = match env.number("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", 0usize)? {
        0 if env.get("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES").is_some() => {
            return Err("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES=0 is not a positive number".into())
        }
        0 => None,
        n => Some(n),
    };
    let node_metadata = env.pairs("CONFIG_GRPC_XDS_NODE_METADATA")?;
    let force_start = env.flag("FORCE_START_WITHOUT_INITIAL_CONFIG", false)?;
    let use_tls = env.flag("CONFIG_GRPC_XDS_SERVER_USE_TLS", false)?;
    let overlay = env.get("TURNSTILE_XDS_OVERLAY").filter(|p| !p.is_empty());
    if !on {
        return match overlay {
            Some(p) => Err(format!(
                "TURNSTILE_XDS_OVERLAY={p} adds turnstile's fields to limits pushed over xDS, and \
                 CONFIG_TYPE is FILE (the files can say them themselves): set \
                 CONFIG_TYPE=GRPC_XDS_SOTW, or unset TURNSTILE_XDS_OVERLAY"
            )),
            None => Ok(None),
        };
    }
    Ok(Some(XdsSettings {
        server: XdsSettings::dial_target(
            &env.string("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000"),
        ),
        node_id: env.string("CONFIG_GRPC_XDS_NODE_ID", "default"),
        node_metadata,
        headers,
        tls: if use_tls { xds_tls(env)? } else { None },
        backoff_initial,
        backoff_max,
        backoff_jitter,
        max_message_bytes,
        overlay: overlay.map(PathBuf::from),
        force_start_without_initial_config: force_start,
        healthy_only_with_config: env.flag("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false)?,
        load: LoadOptions {
            merge_domains: env.flag("MERGE_DOMAIN_CONFIG", false)?,
            include_dotfiles: false,
        },
    }))
}

/// `CONFIG_GRPC_XDS_SERVER_USE_TLS=true`: its files.
fn xds_tls(env: &Env<'_>) -> Result<Option<XdsTls>> {
    let ca_cert = env.get("CONFIG_GRPC_XDS_SERVER_TLS_CACERT").ok_or(
        "CONFIG_GRPC_XDS_SERVER_USE_TLS=true needs CONFIG_GRPC_XDS_SERVER_TLS_CACERT \
         (turnstile does not read the system's CA store)",
    )?;
    let client_identity = env
        .both_or_neither(
            "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
            "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
        )?
        .map(|(cert, key)| ClientIdentity::new(cert, key));
    Ok(Some(XdsTls {
        ca_cert: PathBuf::from(ca_cert),
        client_identity,
        server_name: env.get("CONFIG_GRPC_XDS_SERVER_TLS_SAN"),
    }))
}
