use super::*;

/// Entries of one call, as tests write them.
struct Call(Vec<Vec<(&'static str, &'static str)>>);

impl Entries for Call {
    fn descriptors(&self) -> usize {
        self.0.len()
    }
    fn get(&self, index: usize, key: &str) -> Option<&str> {
        self.0
            .get(index)?
            .iter()
            .rev()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
    }
    fn each(&self, index: usize, f: &mut dyn FnMut(&str, &str)) {
        for (k, v) in &self.0[index] {
            f(k, v);
        }
    }
}

const KUADRANT: &str = r#"
- namespace: ns/route
  name: per-user
  max_value: 5
  seconds: 60
  conditions:
  - 'descriptors[0]["limit.per_user__3f2a1b9c"] == "1"'
  variables:
  - 'descriptors[0]["auth.identity.userid"]'
- namespace: ns/route
  max_value: 100
  seconds: 3600
  conditions:
  - descriptors[0].method == "GET" && descriptors[0].path.startsWith("/api")
  variables: null
"#;

#[test]
fn kuadrant_shapes_are_recognised_and_indexed() {
    let l = Limits::parse("limits.yaml", KUADRANT).unwrap();
    let ns = l.namespace("ns/route").unwrap();
    assert_eq!(ns.limits.len(), 2);
    assert!(matches!(
        ns.limits[0].conditions[0],
        Condition::Equals { .. }
    ));
    assert!(matches!(ns.limits[0].variables[0], Variable::Entry { .. }));
    assert!(matches!(ns.limits[1].conditions[0], Condition::Cel(_)));
    assert_eq!(ns.index.len(), 1);
    assert_eq!(ns.scanned, vec![1]);
    assert_eq!(ns.limits[0].line, 2);
    assert_eq!(ns.limits[1].line, 10);
}

#[test]
fn candidates_are_the_indexed_and_the_scanned() {
    let l = Limits::parse("limits.yaml", KUADRANT).unwrap();
    let ns = l.namespace("ns/route").unwrap();
    let hit = Call(vec![vec![
        ("limit.per_user__3f2a1b9c", "1"),
        ("auth.identity.userid", "alice"),
    ]]);
    assert_eq!(ns.candidates(&hit).as_slice(), &[0, 1]);
    let other = Call(vec![vec![("limit.other__00000000", "1")]]);
    assert_eq!(ns.candidates(&other).as_slice(), &[1]);
}

#[test]
fn conditions_and_variables_evaluate_as_limitador_does() {
    let l = Limits::parse("limits.yaml", KUADRANT).unwrap();
    let ns = l.namespace("ns/route").unwrap();
    let mut cx = Lazy::default();
    let get = Call(vec![vec![("method", "GET"), ("path", "/api/x")]]);
    let limit = &ns.limits[1];
    assert!(limit.conditions[0]
        .holds(&get, &mut cx, limit.names())
        .unwrap());
    // A missing key makes a condition false.
    let mut cx = Lazy::default();
    let no_path = Call(vec![vec![("method", "GET")]]);
    assert!(!limit.conditions[0]
        .holds(&no_path, &mut cx, limit.names())
        .unwrap());
    // An index past the descriptors sent fails the call.
    let mut cx = Lazy::default();
    let none = Call(vec![]);
    let first = &ns.limits[0];
    assert!(first.conditions[0]
        .holds(&none, &mut cx, first.names())
        .is_err());
    assert!(limit.conditions[0]
        .holds(&none, &mut cx, limit.names())
        .is_err());
    // A variable on a missing key: no value, so the limit does not apply.
    let mut cx = Lazy::default();
    let anon = Call(vec![vec![("limit.per_user__3f2a1b9c", "1")]]);
    assert_eq!(
        first.variables[0]
            .value(&anon, &mut cx, first.names())
            .unwrap(),
        None
    );
}

#[test]
fn cel_values_are_written_as_limitador_writes_them() {
    let text = "- namespace: n\n  max_value: 1\n  seconds: 1\n  name: nm\n  conditions: []\n  variables: ['1 + 2', 'true', 'limit.name', 'descriptors[0].k + \"!\"']\n";
    let l = Limits::parse("f", text).unwrap();
    let limit = &l.namespace("n").unwrap().limits[0];
    let call = Call(vec![vec![("k", "v")]]);
    let values: Vec<_> = (limit.variables.iter())
        .map(|v| {
            v.value(&call, &mut Lazy::default(), limit.names())
                .unwrap()
                .unwrap()
        })
        .collect();
    // Sorted by text: `1 + 2`, `descriptors…`, `limit.name`, `true`.
    assert_eq!(values, ["3", "v!", "nm", "true"]);
}

#[test]
fn identity_leaves_out_max_value_name_and_order() {
    let a = "- {namespace: n, max_value: 1, seconds: 60, name: a, variables: [], conditions: ['x == \"1\"', 'y == \"2\"']}\n";
    let b = "- {namespace: n, max_value: 9, seconds: 60, name: b, variables: [], conditions: ['y == \"2\"', 'x == \"1\"']}\n";
    let c =
        "- {namespace: n, max_value: 1, seconds: 61, variables: [], conditions: ['x == \"1\"', 'y == \"2\"']}\n";
    let id = |t: &str| {
        Limits::parse("f", t)
            .unwrap()
            .namespace("n")
            .unwrap()
            .limits[0]
            .identity
    };
    assert_eq!(id(a), id(b));
    assert_ne!(id(a), id(c));
}

#[test]
fn errors_name_the_line_and_the_field() {
    let bad_cel = "- namespace: n\n  max_value: 1\n  seconds: 1\n  conditions:\n  variables: ~\n- namespace: n\n  max_value: 1\n  seconds: 1\n  variables: []\n  conditions: ['descriptors[0][\"a\"] == ']\n";
    let e = Limits::parse("limits.yaml", bad_cel)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("limits.yaml: line 6: limits[1].conditions[0]: couldn't parse"),
        "{e}"
    );
    let no_ns = "- max_value: 1\n  seconds: 1\n  conditions: []\n  variables: []\n";
    let e = Limits::parse("limits.yaml", no_ns).unwrap_err().to_string();
    assert_eq!(
        e,
        "limits.yaml: line 1: limits[0]: missing field `namespace`"
    );
    let e = Limits::parse("limits.yaml", "- namespace: [")
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 1"), "{e}");
}

#[test]
fn an_empty_file_is_no_limits() {
    assert_eq!(Limits::parse("f", "").unwrap().count, 0);
    assert_eq!(Limits::parse("f", "[]\n").unwrap().count, 0);
}
