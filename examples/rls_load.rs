//! A load generator for Envoy's rate limit service over gRPC (`ShouldRateLimit`): the gRPC
//! row of `scripts/bench.sh`, beside its HTTP consume rows measured with wrk.
//!
//! `concurrency` tasks each loop on `ShouldRateLimit` with one descriptor
//! `[subject=user-<n>]`, n uniform in `[1, subjects]` (`hits_addend` unset, as a stock Envoy
//! sends it), over `connections` HTTP/2 connections that multiplex their streams. After
//! `warmup` seconds (not measured), the calls started and answered within the next
//! `duration` seconds are counted, and one line is printed, as `scripts/bench/consume.lua`
//! prints one for wrk (latencies in milliseconds):
//!
//! ```text
//! BENCH requests=N seconds=S rps=R p50_ms=X p99_ms=Y ok=N over=N errors=N
//! ```
//!
//! `requests` counts the answers (`ok`: `OK`, `over`: `OVER_LIMIT`), as wrk does; `errors`
//! the gRPC errors (a 5 s deadline included), which wrk would count as socket errors.
//! Why not ghz: no package registry at hand provides it; this client is built from the
//! crate's own dependencies (tonic, and `envoy-types` for Envoy's `rls.proto`).
//!
//! ```sh
//! cargo build --release --example rls_load
//! QUOTA_GRPC_LISTEN=127.0.0.1:8081 target/release/quota-ledger &   # + a policy of `sms`
//! target/release/examples/rls_load --url http://127.0.0.1:8081 --domain sms \
//!     --concurrency 50 --connections 2 --duration 10 --warmup 2 --subjects 100000 [--token T]
//! ```

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};

/// The command line, with its defaults.
struct Options {
    /// The service's gRPC address (`--url`).
    url: String,
    /// The action asked about (`--domain`).
    domain: String,
    /// Calls in flight at once (`--concurrency`).
    concurrency: usize,
    /// HTTP/2 connections the calls share (`--connections`).
    connections: usize,
    /// Seconds measured (`--duration`).
    duration: u64,
    /// Seconds of calls before, not measured (`--warmup`).
    warmup: u64,
    /// Distinct subjects drawn from (`--subjects`).
    subjects: u64,
    /// A client token, sent as `authorization: Bearer <token>` (`--token`).
    token: Option<String>,
}

/// The number `value` of option `flag`.
fn number<T: std::str::FromStr<Err = std::num::ParseIntError>>(
    flag: &str,
    value: &str,
) -> Result<T, String> {
    value.parse().map_err(|e| format!("{flag} {value}: {e}"))
}

/// The options of `args` (the program's arguments, without its name).
fn parse(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
    let mut o = Options {
        url: "http://127.0.0.1:8081".into(),
        domain: "sms".into(),
        concurrency: 50,
        connections: 2,
        duration: 10,
        warmup: 2,
        subjects: 100_000,
        token: None,
    };
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--url" => o.url = value,
            "--domain" => o.domain = value,
            "--concurrency" => o.concurrency = number(&flag, &value)?,
            "--connections" => o.connections = number(&flag, &value)?,
            "--duration" => o.duration = number(&flag, &value)?,
            "--warmup" => o.warmup = number(&flag, &value)?,
            "--subjects" => o.subjects = number(&flag, &value)?,
            "--token" => o.token = Some(value),
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if o.concurrency == 0 || o.connections == 0 || o.duration == 0 || o.subjects == 0 {
        return Err("--concurrency, --connections, --duration and --subjects must be > 0".into());
    }
    Ok(o)
}

/// What one task saw in the measured window.
#[derive(Default)]
struct Tally {
    /// Latency of every answered call, OK or OVER_LIMIT, in microseconds.
    micros: Vec<u64>,
    /// `OK` answers.
    ok: u64,
    /// `OVER_LIMIT` answers.
    over: u64,
    /// gRPC errors, and answers of another code.
    errors: u64,
}

/// splitmix64: a small, fast generator of the subjects (no rand dependency needed).
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One task: calls until `end`, counting those started at `from` or later and answered by `end`.
async fn run(
    mut client: RateLimitServiceClient<Channel>,
    domain: String,
    subjects: u64,
    token: Option<MetadataValue<Ascii>>,
    mut seed: u64,
    from: Instant,
    end: Instant,
) -> Tally {
    let mut tally = Tally::default();
    loop {
        let started = Instant::now();
        if started >= end {
            return tally;
        }
        let subject = format!("user-{}", 1 + next(&mut seed) % subjects);
        let mut request = tonic::Request::new(RateLimitRequest {
            domain: domain.clone(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "subject".into(),
                    value: subject,
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 0,
        });
        if let Some(token) = &token {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        let answer = client.should_rate_limit(request).await;
        let finished = Instant::now();
        if started < from || finished > end {
            continue;
        }
        match answer.map(|a| a.into_inner().overall_code) {
            Ok(code) if code == Code::Ok as i32 => tally.ok += 1,
            Ok(code) if code == Code::OverLimit as i32 => tally.over += 1,
            _ => {
                tally.errors += 1;
                continue;
            }
        }
        let micros = finished.duration_since(started).as_micros();
        tally.micros.push(u64::try_from(micros).unwrap_or(u64::MAX));
    }
}

/// The `q` quantile of sorted latencies, in milliseconds (0 when there are none).
fn quantile_ms(sorted: &[u64], q: f64) -> f64 {
    let Some(last) = sorted.len().checked_sub(1) else {
        return 0.0;
    };
    let rank = ((q * sorted.len() as f64).ceil() as usize)
        .saturating_sub(1)
        .min(last);
    sorted[rank] as f64 / 1000.0
}

/// Connects, runs the tasks, prints the BENCH line.
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let o = parse(std::env::args().skip(1)).unwrap_or_else(|e| {
        eprintln!("rls_load: {e}\nusage: rls_load [--url U] [--domain D] [--concurrency N] [--connections N] [--duration S] [--warmup S] [--subjects N] [--token T]");
        std::process::exit(2)
    });
    let endpoint = Endpoint::from_shared(o.url.clone())?
        .timeout(Duration::from_secs(5))
        .tcp_nodelay(true);
    let mut channels = Vec::with_capacity(o.connections);
    for _ in 0..o.connections {
        channels.push(endpoint.connect().await?);
    }
    let token = (o.token.as_ref())
        .map(|t| format!("Bearer {t}").parse::<MetadataValue<Ascii>>())
        .transpose()?;
    let from = Instant::now() + Duration::from_secs(o.warmup);
    let end = from + Duration::from_secs(o.duration);
    let clock = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as u64;
    let tasks: Vec<_> = (0..o.concurrency)
        .map(|i| {
            let client = RateLimitServiceClient::new(channels[i % channels.len()].clone());
            let seed = clock ^ (i as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
            tokio::spawn(run(
                client,
                o.domain.clone(),
                o.subjects,
                token.clone(),
                seed,
                from,
                end,
            ))
        })
        .collect();
    let mut all = Tally::default();
    for task in tasks {
        let tally = task.await?;
        all.micros.extend(tally.micros);
        all.ok += tally.ok;
        all.over += tally.over;
        all.errors += tally.errors;
    }
    all.micros.sort_unstable();
    let requests = all.ok + all.over;
    let seconds = o.duration as f64;
    println!(
        "BENCH requests={requests} seconds={seconds:.3} rps={:.1} p50_ms={:.3} p99_ms={:.3} ok={} over={} errors={}",
        requests as f64 / seconds,
        quantile_ms(&all.micros, 0.50),
        quantile_ms(&all.micros, 0.99),
        all.ok,
        all.over,
        all.errors
    );
    Ok(())
}
