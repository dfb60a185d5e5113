//! A config built to replace the one being served (a reload) holds once what the two have in
//! common, and reads exactly as a config built alone.

use std::sync::Arc;

use super::*;
use crate::config::build::Builder;

/// Tenants a and b (each a limit and a child `path` limit), a tenant c with a limit when
/// `with_c`, then the two route patterns in the order given.
fn saas(b_rpu: u32, with_c: bool, patterns: [(&str, u32); 2]) -> String {
    let mut y = String::from("domain: saas\ndescriptors:\n");
    for (tenant, rpu) in [("a", 100), ("b", b_rpu)] {
        y.push_str(&format!(
            "  - key: tenant\n    value: {tenant}\n    rate_limit: {{unit: minute, requests_per_unit: {rpu}}}\n    descriptors:\n      - key: path\n        rate_limit: {{unit: second, requests_per_unit: 10}}\n"
        ));
    }
    if with_c {
        y.push_str("  - key: tenant\n    value: c\n    rate_limit: {unit: minute, requests_per_unit: 100}\n");
    }
    for (pattern, rpu) in patterns {
        y.push_str(&format!(
            "  - key: route\n    value: \"{pattern}\"\n    rate_limit: {{unit: hour, requests_per_unit: {rpu}}}\n"
        ));
    }
    y
}

fn served() -> String {
    saas(100, false, [("api-*", 5), ("web-*", 6)])
}

/// Tenant b's limit raised, tenant c added, the two patterns swapped.
fn edited() -> String {
    saas(500, true, [("web-*", 6), ("api-*", 5)])
}

fn built_beside(served: &Arc<Config>, yaml: &str) -> Config {
    let served = Arc::clone(served);
    let live = LiveConfig::new(move || Arc::clone(&served) as Arc<dyn AsRef<Config> + Send + Sync>);
    let mut builder = Builder::beside(&live);
    super::super::yaml::add_file(&mut builder, "conf/a.yaml", yaml, LoadOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    builder.finish()
}

/// The node of `stat_key`.
fn node<'c>(c: &'c Config, stat_key: &str) -> &'c Node {
    let mut found = None;
    c.for_each_node(&mut |n| {
        if &*n.stat_key == stat_key {
            found = Some(n);
        }
    });
    found.unwrap_or_else(|| panic!("no node {stat_key}"))
}

#[test]
fn a_reload_shares_what_did_not_change_and_reads_as_a_fresh_load() {
    let served = Arc::new(load(&served()));
    let before = served.describe();
    let new = built_beside(&served, &edited());
    assert_eq!(new.describe(), load(&edited()).describe());
    assert_eq!(
        served.describe(),
        before,
        "the served config is left as it was"
    );

    let same = |stat_key: &str| (node(&served, stat_key), node(&new, stat_key));
    let (old_a, new_a) = same("saas.tenant_a");
    assert!(Arc::ptr_eq(&old_a.stat_key, &new_a.stat_key));
    assert!(Arc::ptr_eq(&old_a.limits, &new_a.limits));
    let (old_path, new_path) = same("saas.tenant_a.path");
    assert!(Arc::ptr_eq(&old_path.stat_key, &new_path.stat_key));
    assert!(Arc::ptr_eq(&old_path.limits, &new_path.limits));

    // Tenant b's limit changed: its own list, the new value; its name is still shared.
    let (old_b, new_b) = same("saas.tenant_b");
    assert!(Arc::ptr_eq(&old_b.stat_key, &new_b.stat_key));
    assert!(!Arc::ptr_eq(&old_b.limits, &new_b.limits));
    assert_eq!(new_b.limits[0].requests_per_unit, 500);
    assert_eq!(old_b.limits[0].requests_per_unit, 100);

    // A pattern that moved is its own, and still matches in the new order.
    let (old_web, new_web) = same("saas.route_web-*");
    assert!(!Arc::ptr_eq(&old_web.stat_key, &new_web.stat_key));
    assert_eq!(new_web.limits[0].requests_per_unit, 6);
    let c = node(&new, "saas.tenant_c");
    assert_eq!(c.limits[0].requests_per_unit, 100);
    assert!(Arc::ptr_eq(&c.limits, &new_a.limits), "equal lists are one");
}

#[test]
fn one_config_holds_each_key_and_each_list_of_limits_once() {
    let c = load(&served());
    let (a, b) = (
        node(&c, "saas.tenant_a.path"),
        node(&c, "saas.tenant_b.path"),
    );
    assert!(Arc::ptr_eq(&a.key, &b.key));
    assert!(Arc::ptr_eq(&a.limits, &b.limits));
    let (ta, tb) = (node(&c, "saas.tenant_a"), node(&c, "saas.tenant_b"));
    assert!(Arc::ptr_eq(&ta.limits, &tb.limits));
    assert!(!Arc::ptr_eq(&ta.limits, &a.limits));
}

#[test]
fn past_the_interning_bound_every_limit_is_still_its_own() {
    let mut yaml = String::from("domain: d\ndescriptors:\n");
    for i in 0..5000 {
        yaml.push_str(&format!(
            "  - key: k{i}\n    rate_limit: {{unit: second, requests_per_unit: {i}}}\n"
        ));
    }
    let served = Arc::new(load(&yaml));
    for c in [&*served, &built_beside(&served, &yaml)] {
        for i in [0, 4095, 4096, 4999] {
            let n = node(c, &format!("d.k{i}"));
            assert_eq!(n.limits[0].requests_per_unit, i);
            assert_eq!(&*n.key, format!("k{i}"));
        }
    }
}
