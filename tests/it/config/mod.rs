//! Configs as operators write them, at scale: a config of 50 000 tenants checked, served and
//! reloaded by the binary.

mod big_config;
