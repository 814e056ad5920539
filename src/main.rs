//! The `quota-ledger` binary: `serve` (default), `migrate`, `openapi`.

use anyhow::Context;
use clap::{Parser, Subcommand};
use quota_ledger::config::Settings;
use quota_ledger::startup::Application;
use tracing_subscriber::EnvFilter;

/// mimalloc: the hot path allocates many small, short-lived buffers per request, which
/// glibc's malloc served at about 15% of the service's CPU.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Daily business limits, enforced atomically. Configuration comes from the environment.
#[derive(Debug, Parser)]
#[command(name = "quota-ledger", version)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the API (the default).
    Serve,
    /// Apply the policy store's migrations and exit.
    Migrate,
    /// Print the OpenAPI document and exit.
    Openapi,
}

fn init_logging(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

#[actix_web::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(Command::Openapi) = cli.command {
        print!("{}", quota_ledger::api::openapi::spec_json());
        return Ok(());
    }
    let settings = Settings::from_env().context("reading the configuration")?;
    init_logging(settings.log_json);
    if let Some(Command::Migrate) = cli.command {
        quota_ledger::db::migrate_url(&settings.database_url).await?;
        tracing::info!("migrations applied");
        return Ok(());
    }
    let app = Application::build(settings).await?;
    let base = format!("http://127.0.0.1:{}", app.port());
    if app.admin_token_generated() {
        println!(
            "admin token (generated; set QUOTA_ADMIN_TOKEN to choose one): {}",
            app.admin_token().expose()
        );
    }
    println!(
        "quota-ledger listening on port {}; Swagger UI: {base}/swagger-ui/",
        app.port()
    );
    app.run_until_stopped().await.context("serving")
}
