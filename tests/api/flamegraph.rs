//! `scripts/flamegraph.py`, which draws the flame graphs of docs/flamegraphs and splits the
//! HTTP workers' time for docs/performance.md: run on a small `perf script` text.

use std::path::Path;
use std::process::Command;

/// Three samples in `perf script -F comm,tid,period,ip,sym` form: two of an HTTP worker
/// (one in the engine, one in the kernel) and one of SQLite's thread.
const SAMPLES: &str = "\
actix-rt|system 11981    1003009 
\t         1449360 quota_ledger::engine::codec::entry::encode
\t         10b11f2 quota_ledger::engine::decision::consume::<impl quota_ledger::engine::Decider>::charge::{{closure}}
\t         13d4f7d actix_web::handler::handler_service::{{closure}}
\t         1e9938e start_thread

actix-rt|system 11982    1003009 
\tffffffff821f8914 tcp_sendmsg
\tffffffff81000130 entry_SYSCALL_64_after_hwframe
\t          10aba4 __send
\t         13d4f7d actix_http::h1::dispatcher::InnerDispatcher<T>::poll_flush
\t         1e9938e start_thread

sqlx-sqlite-wor 11990    1003009 
\t         1449360 sqlite3VdbeExec
\t         1e9938e start_thread

";

#[test]
fn the_flame_graph_tool_folds_draws_and_splits_only_the_threads_asked_for() {
    let dir = std::env::temp_dir().join(format!("quota-ledger-flamegraph-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("perf.txt");
    std::fs::write(&input, SAMPLES).unwrap();
    let (svg, folded) = (dir.join("g.svg"), dir.join("folded.txt"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/flamegraph.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(&input)
        .args(["--threads", "actix-rt", "--split", "--title", "two samples"])
        .arg("-o")
        .arg(&svg)
        .arg("--folded")
        .arg(&folded)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Root first, generic parameters cut, SQLite's sample left out.
    let folded = std::fs::read_to_string(&folded).unwrap();
    assert_eq!(
        folded.lines().collect::<Vec<_>>(),
        [
            "start_thread;actix_http::h1::dispatcher::InnerDispatcher::poll_flush;__send;\
             entry_SYSCALL_64_after_hwframe;tcp_sendmsg 1",
            "start_thread;actix_web::handler::handler_service::{{closure}};\
             quota_ledger::engine::decision::consume::::charge::{{closure}};\
             quota_ledger::engine::codec::entry::encode 1",
        ]
    );
    // One sample in the kernel, one in the engine.
    assert!(stdout.contains("2 samples"), "{stdout}");
    assert!(stdout.contains(" 50.0%  the kernel"), "{stdout}");
    assert!(stdout.contains(" 50.0%  the engine"), "{stdout}");
    // A box per frame, each named in its tooltip with its share.
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg"), "{svg}");
    assert!(svg.contains("two samples"));
    assert!(svg.contains("<title>tcp_sendmsg (1 samples, 50.00%)</title>"));
    assert!(svg.contains("<title>start_thread (2 samples, 100.00%)</title>"));
    assert!(!svg.contains("sqlite3VdbeExec"));
    std::fs::remove_dir_all(&dir).unwrap();
}
