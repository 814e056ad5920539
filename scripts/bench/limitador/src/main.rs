//! limitador-peer: Limitador's own library behind actix-web, as limitador-server serves it,
//! for quota-ledger's benchmark (scripts/bench/limitador.py starts it).
//!
//!   limitador-peer [--listen ADDR] [--redis URL] [--limit NAMESPACE=MAX]... [--seconds N]
//!                  [--variable NAME] [--cache-size N]
//!
//! --listen     the HTTP address (LIMITADOR_PEER_LISTEN; 127.0.0.1:8080)
//! --redis      the counters in Redis at URL, through Limitador's AsyncRedisStorage and its
//!              AsyncRateLimiter, as limitador-server's `redis URL` storage (REDIS_URL); without
//!              it, in memory: its RateLimiter on InMemoryStorage, as limitador-server's `memory`
//! --limit      one limit: NAMESPACE at most MAX per window, for each value of the variable
//!              (repeatable; sms=1000000000 when none is given)
//! --seconds    the window of every limit (86400)
//! --variable   the limits' one variable, the key of `values` that names the subject (subject)
//! --cache-size the in-memory storage's counter capacity (10000000: more than any run's
//!              subjects, as limitador-server sizes it to the memory it finds when not told)
//!
//! Routes, as limitador-server's: POST /check_and_report with a JSON body
//! `{"namespace": "sms", "values": {"subject": "u1"}, "delta": 1}` answers 200 when within
//! every limit that applies (and charges DELTA), 429 when over one, 400 for a body that does
//! not parse, 500 when the storage fails; GET /status answers 200 (readiness).

use std::collections::HashMap;
use std::process::exit;

use actix_web::{web, App, HttpResponse, HttpServer};
use limitador::limit::{Limit, Namespace};
use limitador::storage::redis::AsyncRedisStorage;
use limitador::{AsyncRateLimiter, RateLimiter};
use serde::Deserialize;

/// The two kinds of limiter limitador-server runs: blocking for the in-memory storage,
/// async for Redis.
enum Limiter {
    Blocking(RateLimiter),
    Async(AsyncRateLimiter),
}

/// limitador-server's CheckAndReportInfo.
#[derive(Deserialize)]
struct CheckAndReport {
    namespace: String,
    values: HashMap<String, String>,
    delta: i64,
}

struct Config {
    listen: String,
    redis: Option<String>,
    limits: Vec<(String, i64)>,
    seconds: u64,
    variable: String,
    cache_size: u64,
}

const USAGE: &str = "usage: limitador-peer [--listen ADDR] [--redis URL] \
                     [--limit NAMESPACE=MAX]... [--seconds N] [--variable NAME] [--cache-size N]";

fn usage(problem: &str) -> ! {
    eprintln!("limitador-peer: {problem}");
    eprintln!("{USAGE}");
    exit(2)
}

fn number<T: std::str::FromStr>(flag: &str, raw: &str) -> T {
    raw.parse()
        .unwrap_or_else(|_| usage(&format!("{flag} {raw}: not a whole number")))
}

fn config() -> Config {
    let mut config = Config {
        listen: std::env::var("LIMITADOR_PEER_LISTEN").unwrap_or_else(|_| "127.0.0.1:8080".into()),
        redis: std::env::var("REDIS_URL")
            .ok()
            .filter(|url| !url.is_empty()),
        limits: Vec::new(),
        seconds: 86400,
        variable: "subject".into(),
        cache_size: 10_000_000,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            println!(
                "limitador-peer: Limitador's library behind actix-web (POST /check_and_report)"
            );
            println!("{USAGE}");
            exit(0);
        }
        let value = args
            .next()
            .unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        match flag.as_str() {
            "--listen" => config.listen = value,
            "--redis" => config.redis = Some(value),
            "--limit" => {
                let (namespace, max) = value
                    .split_once('=')
                    .unwrap_or_else(|| usage(&format!("--limit {value}: NAMESPACE=MAX")));
                config
                    .limits
                    .push((namespace.to_owned(), number("--limit", max)));
            }
            "--seconds" => config.seconds = number(&flag, &value),
            "--variable" => config.variable = value,
            "--cache-size" => config.cache_size = number(&flag, &value),
            _ => usage(&format!("unknown argument {flag}")),
        }
    }
    if config.limits.is_empty() {
        config.limits.push(("sms".into(), 1_000_000_000));
    }
    config
}

async fn check_and_report(
    limiter: web::Data<Limiter>,
    request: web::Json<CheckAndReport>,
) -> HttpResponse {
    let CheckAndReport {
        namespace,
        values,
        delta,
    } = request.into_inner();
    let namespace = Namespace::from(namespace);
    // load_counters false, as limitador-server's check_and_report: no remaining counts to
    // read back for headers.
    let result = match limiter.get_ref() {
        Limiter::Blocking(limiter) => {
            limiter.check_rate_limited_and_update(&namespace, &values, delta, false)
        }
        Limiter::Async(limiter) => {
            limiter
                .check_rate_limited_and_update(&namespace, &values, delta, false)
                .await
        }
    };
    match result {
        Ok(checked) if checked.limited => HttpResponse::TooManyRequests().body("Too many requests"),
        // limitador-server answers Json(()): `null`.
        Ok(_) => HttpResponse::Ok().json(()),
        Err(_) => HttpResponse::InternalServerError().body("Internal server error"),
    }
}

async fn status() -> HttpResponse {
    HttpResponse::Ok().json(())
}

async fn run(config: Config) -> std::io::Result<()> {
    let limiter = match &config.redis {
        Some(url) => match AsyncRedisStorage::new(url).await {
            Ok(storage) => Limiter::Async(AsyncRateLimiter::new_with_storage(Box::new(storage))),
            Err(error) => {
                eprintln!("limitador-peer: Redis at {url}: {error}");
                exit(1)
            }
        },
        None => Limiter::Blocking(RateLimiter::new(config.cache_size)),
    };
    for (namespace, max) in &config.limits {
        let no_conditions: [&str; 0] = [];
        let limit = Limit::new(
            namespace.as_str(),
            *max,
            config.seconds,
            no_conditions,
            [config.variable.as_str()],
        );
        match &limiter {
            Limiter::Blocking(limiter) => limiter.add_limit(limit),
            Limiter::Async(limiter) => limiter.add_limit(limit),
        };
    }
    let storage = if config.redis.is_some() {
        "redis"
    } else {
        "memory"
    };
    let limits: Vec<String> = config
        .limits
        .iter()
        .map(|(n, m)| format!("{n}={m}"))
        .collect();
    eprintln!(
        "limitador-peer: {storage} storage, limits {} per {} s by {}, listening on {}",
        limits.join(","),
        config.seconds,
        config.variable,
        config.listen
    );
    let data = web::Data::new(limiter);
    HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .route("/status", web::get().to(status))
            .route("/check_and_report", web::post().to(check_and_report))
    })
    .bind(&config.listen)?
    .run()
    .await
}

fn main() {
    let config = config();
    // actix-web's runtime, as limitador-server's #[actix_rt::main]: the Redis connection
    // manager's task runs on this thread's runtime, the requests on the workers'.
    if let Err(error) = actix_web::rt::System::new().block_on(run(config)) {
        eprintln!("limitador-peer: {error}");
        exit(1);
    }
}
