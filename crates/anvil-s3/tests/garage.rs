//! S3Store against a live S3-compatible store: the env file that `scripts/garage.sh start DIR`
//! writes, named by ANVIL_S3_TEST_ENV (read here, not taken from the process environment).
//! Without it each test prints "skipped: ..." and passes, unless ANVIL_REQUIRE_S3=1.
//!
//!   scripts/garage.sh start /tmp/garage
//!   ANVIL_S3_TEST_ENV=/tmp/garage/env cargo test -p anvil-s3

use anvil::device::BlobStore;
use anvil_s3::S3Store;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The variables of the test store, or `None` (after saying so) when there is none.
fn store_vars() -> Option<Vec<(String, String)>> {
    let path = std::env::var("ANVIL_S3_TEST_ENV").unwrap_or_default();
    if path.is_empty() {
        if std::env::var("ANVIL_REQUIRE_S3").as_deref() == Ok("1") {
            panic!(
                "ANVIL_REQUIRE_S3=1 but there is no object store: set ANVIL_S3_TEST_ENV to DIR/env of `scripts/garage.sh start DIR`"
            );
        }
        eprintln!(
            "skipped: no object store (set ANVIL_S3_TEST_ENV to DIR/env of `scripts/garage.sh start DIR`)"
        );
        return None;
    }
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("ANVIL_S3_TEST_ENV={path}: cannot read it: {e}"));
    let vars: Vec<(String, String)> = text
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            let line = line.strip_prefix("export ").unwrap_or(line);
            let (name, value) = line.split_once('=')?;
            let value = value.trim().trim_matches(|c| c == '"' || c == '\'');
            (!name.starts_with('#')).then(|| (name.trim().to_string(), value.to_string()))
        })
        .collect();
    assert!(
        vars.iter().any(|(k, _)| k == "AWS_ACCESS_KEY_ID"),
        "ANVIL_S3_TEST_ENV={path} sets no AWS_ACCESS_KEY_ID"
    );
    Some(vars)
}

fn var<'a>(vars: &'a [(String, String)], name: &str) -> &'a str {
    vars.iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("the test store's env file sets no {name}"))
}

/// A prefix no other run (or test) uses.
fn unique(test: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "anvil-s3-test/{}-{nanos:x}-{}/{test}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A store under a fresh prefix of the test bucket.
fn open(vars: &[(String, String)], test: &str) -> S3Store {
    let url = format!("s3://{}/{}/", var(vars, "ANVIL_S3_BUCKET"), unique(test));
    let store = S3Store::open_with_vars(&url, vars.iter().cloned()).unwrap();
    store.check_access().unwrap();
    store
}

/// The listing of `prefix` once it shows none of the `deleted` keys. Garage 2.5.0 may list a
/// key for a moment after its DELETE returned: each node drops deleted entries before the
/// node answering the LIST merges their replies, so a read quorum holding one node that has
/// not applied the delete yet shows the key. A GET of such a key already says NotFound.
fn list_after_deletes(store: &S3Store, prefix: &str, deleted: &[String]) -> Vec<(String, u64)> {
    let started = std::time::Instant::now();
    loop {
        let listed = store.list(prefix).unwrap();
        let stale: Vec<&String> = listed
            .iter()
            .map(|(k, _)| k)
            .filter(|k| deleted.contains(k))
            .collect();
        if stale.is_empty() {
            return listed;
        }
        for key in &stale {
            let e = store.get(key).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NotFound, "{key} was deleted: {e}");
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "deleted keys still listed after 5 s: {stale:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn clean(store: &S3Store) {
    let keys: Vec<String> = store
        .list("")
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    for key in &keys {
        store.delete(key).unwrap();
    }
    assert!(list_after_deletes(store, "", &keys).is_empty());
}

fn assert_one_line(e: &io::Error) -> String {
    let text = e.to_string();
    assert!(!text.contains('\n') && !text.contains('\r'), "{text:?}");
    assert!(text.len() < 600, "{text}");
    text
}

#[test]
fn objects_round_trip_with_exact_ranges_sorted_listings_and_deletes() {
    let Some(vars) = store_vars() else { return };
    let store = open(&vars, "round-trip");
    assert!(store.describe().starts_with("s3://"));
    assert!(store.describe().ends_with("/round-trip"));

    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    store.put("seg/2", &data).unwrap();
    store.put("seg/1", b"one").unwrap();
    store.put("segment", b"s").unwrap();
    store.put("meta/super", b"super").unwrap();

    assert_eq!(store.get("seg/2").unwrap(), data);
    assert_eq!(store.get_range("seg/2", 0, 10).unwrap(), &data[..10]);
    assert_eq!(
        store.get_range("seg/2", 4_096, 50_000).unwrap(),
        &data[4_096..54_096]
    );
    assert_eq!(
        store.get_range("seg/2", 99_999, 1).unwrap(),
        &data[99_999..]
    );
    assert!(store.get_range("seg/2", 100_000, 0).unwrap().is_empty());

    // Short: the range runs past the end, starts at the end, starts past it.
    for (offset, len) in [(99_990, 11), (100_000, 1), (200_000, 5), (100_001, 0)] {
        let e = store.get_range("seg/2", offset, len).unwrap_err();
        assert_eq!(
            e.kind(),
            io::ErrorKind::UnexpectedEof,
            "{offset}+{len}: {e}"
        );
        assert_one_line(&e);
    }

    // Absent objects.
    for e in [
        store.get("seg/3").unwrap_err(),
        store.get_range("seg/3", 0, 1).unwrap_err(),
        store.get_range("seg/3", 0, 0).unwrap_err(),
    ] {
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        assert!(assert_one_line(&e).contains("seg/3"), "{e}");
    }

    // Listings: relative to the volume, sorted, by string prefix, with sizes.
    assert_eq!(
        store.list("seg/").unwrap(),
        vec![("seg/1".to_string(), 3), ("seg/2".to_string(), 100_000)]
    );
    assert_eq!(
        store.list("seg").unwrap(),
        vec![
            ("seg/1".to_string(), 3),
            ("seg/2".to_string(), 100_000),
            ("segment".to_string(), 1)
        ]
    );
    assert_eq!(
        store.list("seg/2").unwrap(),
        vec![("seg/2".to_string(), 100_000)]
    );
    assert_eq!(
        store.list("me").unwrap(),
        vec![("meta/super".to_string(), 5)]
    );
    assert!(store.list("nothing/").unwrap().is_empty());
    assert!(store.list("seg//").unwrap().is_empty());
    let all = store.list("").unwrap();
    let keys: Vec<&str> = all.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["meta/super", "seg/1", "seg/2", "segment"]);

    // put_if_absent creates; on a store that honours the condition a second one is refused
    // (Garage overwrites instead, which the caller probes for).
    assert!(store.put_if_absent("lock", b"first").unwrap());
    let again = store.put_if_absent("lock", b"second").unwrap();
    let expected: &[u8] = if again { b"second" } else { b"first" };
    assert_eq!(store.get("lock").unwrap(), expected);

    // Overwrite, delete, delete again.
    store.put("seg/1", b"uno!").unwrap();
    assert_eq!(store.get("seg/1").unwrap(), b"uno!");
    store.delete("seg/1").unwrap();
    store.delete("seg/1").unwrap();
    assert_eq!(
        store.get("seg/1").unwrap_err().kind(),
        io::ErrorKind::NotFound
    );
    assert_eq!(
        list_after_deletes(&store, "seg/", &["seg/1".to_string()]),
        vec![("seg/2".to_string(), 100_000)]
    );

    // Keys no object can have.
    for bad in ["", "/x", "x/", "a//b"] {
        let e = store.put(bad, b"x").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
    }

    // An empty object.
    store.put("empty", b"").unwrap();
    assert!(store.get("empty").unwrap().is_empty());
    assert!(store.get_range("empty", 0, 0).unwrap().is_empty());
    assert_eq!(
        store.get_range("empty", 0, 1).unwrap_err().kind(),
        io::ErrorKind::UnexpectedEof
    );

    clean(&store);
}

#[test]
fn listings_page_past_a_thousand_keys_with_puts_from_many_threads() {
    let Some(vars) = store_vars() else { return };
    let store = open(&vars, "pages");
    const KEYS: usize = 1_234;
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..16 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= KEYS {
                    break;
                }
                store
                    .put(&format!("many/{i:05}"), &vec![1u8; i % 7])
                    .unwrap();
            });
        }
    });
    store.put("other", b"x").unwrap();

    let listed = store.list("many/").unwrap();
    assert_eq!(listed.len(), KEYS);
    for (i, (key, size)) in listed.iter().enumerate() {
        assert_eq!(key, &format!("many/{i:05}"));
        assert_eq!(*size, (i % 7) as u64);
    }
    assert_eq!(store.list("").unwrap().len(), KEYS + 1);
    assert_eq!(store.list("many/001").unwrap().len(), 100);

    // Deletes from many threads too.
    let keys = store.list("").unwrap();
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..16 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((key, _)) = keys.get(i) else { break };
                store.delete(key).unwrap();
            });
        }
    });
    let deleted: Vec<String> = keys.into_iter().map(|(k, _)| k).collect();
    assert!(list_after_deletes(&store, "", &deleted).is_empty());
}

#[test]
fn volumes_under_nested_prefixes_see_only_their_own_keys() {
    let Some(vars) = store_vars() else { return };
    let outer = open(&vars, "nested");
    let url = format!("{}/inner/vol///", outer.describe());
    let inner = S3Store::open_with_vars(&url, vars.iter().cloned()).unwrap();
    assert_eq!(inner.describe(), format!("{}/inner/vol", outer.describe()));
    inner.put("k", b"inner").unwrap();
    outer.put("k", b"outer").unwrap();
    assert_eq!(inner.list("").unwrap(), vec![("k".to_string(), 5)]);
    assert_eq!(
        outer.list("").unwrap(),
        vec![("inner/vol/k".to_string(), 5), ("k".to_string(), 5)]
    );
    assert_eq!(outer.get("inner/vol/k").unwrap(), b"inner");
    assert_eq!(inner.get("k").unwrap(), b"inner");
    clean(&outer);
}

#[test]
fn wrong_credentials_are_one_line_and_say_so() {
    let Some(vars) = store_vars() else { return };
    let bucket = var(&vars, "ANVIL_S3_BUCKET");
    let url = format!("s3://{bucket}/{}", unique("credentials"));
    let wrong_secret: Vec<(String, String)> = vars
        .iter()
        .cloned()
        .chain([("AWS_SECRET_ACCESS_KEY".to_string(), "0".repeat(64))])
        .collect();
    let wrong_key: Vec<(String, String)> = vars
        .iter()
        .cloned()
        .chain([(
            "AWS_ACCESS_KEY_ID".to_string(),
            "GK000000000000000000000000".to_string(),
        )])
        .collect();
    for (what, vars) in [("secret", wrong_secret), ("key id", wrong_key)] {
        let store = S3Store::open_with_vars(&url, vars).unwrap();
        let e = store.check_access().unwrap_err();
        let text = assert_one_line(&e);
        assert!(text.contains("refused the credentials"), "{what}: {text}");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{what}: {text}");
        let e = store.get("x").unwrap_err();
        assert!(
            assert_one_line(&e).contains("refused the credentials"),
            "{what}: {e}"
        );
        let e = store.put("x", b"x").unwrap_err();
        assert!(
            assert_one_line(&e).contains("refused the credentials"),
            "{what}: {e}"
        );
        eprintln!("wrong {what}: {text}");
    }
}

#[test]
fn a_missing_bucket_is_one_line_naming_bucket_and_endpoint() {
    let Some(vars) = store_vars() else { return };
    let endpoint = var(&vars, "AWS_ENDPOINT_URL").trim_end_matches('/');
    let url = format!("s3://anvil-no-such-bucket-{}/vol", std::process::id());
    let store = S3Store::open_with_vars(&url, vars.iter().cloned()).unwrap();
    let expected = format!(
        "bucket anvil-no-such-bucket-{} does not exist at {endpoint}",
        std::process::id()
    );
    let e = store.check_access().unwrap_err();
    let text = assert_one_line(&e);
    assert!(text.contains(&expected), "{text}");
    eprintln!("missing bucket: {text}");
    // Not NotFound: a caller must not take a missing bucket for a missing object.
    for e in [
        store.get("x").unwrap_err(),
        store.list("").unwrap_err(),
        store.put("x", b"x").unwrap_err(),
    ] {
        assert!(assert_one_line(&e).contains(&expected), "{e}");
        assert_ne!(e.kind(), io::ErrorKind::NotFound, "{e}");
    }
}
