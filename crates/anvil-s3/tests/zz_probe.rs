use anvil::device::BlobStore;
use anvil_s3::S3Store;

#[test]
fn probe_delete_then_list() {
    let text = std::fs::read_to_string(std::env::var("ANVIL_S3_TEST_ENV").unwrap()).unwrap();
    let vars: Vec<(String, String)> = text.lines().filter_map(|l| {
        let (k, v) = l.strip_prefix("export ")?.split_once('=')?; Some((k.to_string(), v.to_string()))
    }).collect();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let store = S3Store::open_with_vars(&format!("s3://anvil/probe-{nanos}"), vars).unwrap();
    let (mut stale_lists, mut stale_gets, mut rounds) = (0, 0, 0);
    for round in 0..40 {
        rounds += 1;
        let keys: Vec<String> = (0..64).map(|i| format!("r{round}/k{i:03}")).collect();
        std::thread::scope(|s| for chunk in keys.chunks(8) { let store = &store; s.spawn(move || for k in chunk { store.put(k, b"x").unwrap(); }); });
        let listed = store.list(&format!("r{round}/")).unwrap();
        if listed.len() != 64 { eprintln!("round {round}: after puts only {} listed", listed.len()); }
        std::thread::scope(|s| for chunk in keys.chunks(8) { let store = &store; s.spawn(move || for k in chunk { store.put(k, b"longer").unwrap(); }); });
        let listed = store.list(&format!("r{round}/")).unwrap();
        let old = listed.iter().filter(|(_, n)| *n != 6).count();
        if listed.len() != 64 || old > 0 { eprintln!("round {round}: after overwrites {} listed, {old} with the old size", listed.len()); }
        std::thread::scope(|s| for chunk in keys.chunks(8) { let store = &store; s.spawn(move || for k in chunk { store.delete(k).unwrap(); }); });
        let left = store.list(&format!("r{round}/")).unwrap();
        if !left.is_empty() {
            stale_lists += 1;
            for (k, _) in &left {
                match store.get(k) { Ok(_) => { stale_gets += 1; eprintln!("round {round}: {k} listed AND readable") }
                    Err(e) => eprintln!("round {round}: {k} listed, get: {:?}", e.kind()) }
            }
            let mut waited = 0;
            while !store.list(&format!("r{round}/")).unwrap().is_empty() { std::thread::sleep(std::time::Duration::from_millis(10)); waited += 10; }
            eprintln!("round {round}: {} stale keys listed; gone from listings after {waited} ms", left.len());
        }
    }
    eprintln!("{stale_lists} of {rounds} rounds listed deleted keys; {stale_gets} deleted keys still readable");
}
