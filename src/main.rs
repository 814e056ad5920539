//! The `quota-ledger` binary: `serve` (default), `migrate`, `openapi`, `counters rebuild`.

use anyhow::Context;
use clap::{Parser, Subcommand};
use quota_ledger::cli::policies::{self, Exit, Remote};
use quota_ledger::cli::{counters, keys, webhooks};
use quota_ledger::config::{ConfigArgs, Settings};
use quota_ledger::startup::Application;

/// mimalloc: the hot path allocates many small, short-lived buffers per request, which
/// glibc's malloc served at about 15% of the service's CPU.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Daily business limits, enforced atomically. Configuration comes from the environment
/// (or the flags that mirror it).
#[derive(Debug, Parser)]
#[command(name = "quota-ledger", version, after_help = quota_ledger::config::READ_ELSEWHERE_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Every setting; read for `serve` and `migrate` only.
    #[command(flatten)]
    config: ConfigArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the API (the default).
    #[command(after_help = quota_ledger::config::READ_ELSEWHERE_HELP)]
    Serve,
    /// Apply the database's migrations (policies and ledger) and exit.
    Migrate,
    /// Print the OpenAPI document and exit.
    Openapi,
    /// Operate on the counters in Redis.
    #[command(subcommand)]
    Counters(CountersCommand),
    /// Policies as code: export, diff and apply policy files over the admin API of a
    /// running service (QUOTA_ADMIN_TOKEN).
    Policies {
        #[command(flatten)]
        service: ServiceUrl,
        #[command(subcommand)]
        command: PoliciesCommand,
    },
    /// API keys: create, list and revoke them over the admin API of a running service
    /// (QUOTA_ADMIN_TOKEN).
    Keys {
        #[command(flatten)]
        service: ServiceUrl,
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Alert endpoints: create, list, switch, delete them, rotate their secret, send a
    /// test event and read their deliveries over the admin API of a running service
    /// (QUOTA_ADMIN_TOKEN).
    Webhooks {
        #[command(flatten)]
        service: ServiceUrl,
        #[command(subcommand)]
        command: webhooks::Command,
    },
}

/// The running service a command talks to, over its admin API.
#[derive(Debug, clap::Args)]
struct ServiceUrl {
    /// The service's base URL.
    #[arg(
        long,
        env = "QUOTA_URL",
        value_name = "URL",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    url: String,
}

#[derive(Debug, Subcommand)]
enum PoliciesCommand {
    /// Print every policy of the service as a policy file (YAML, or JSON with --json).
    Export {
        /// JSON instead of YAML.
        #[arg(long)]
        json: bool,
    },
    /// Print what `apply FILE` would change; exit 0 when nothing would, 2 when something
    /// would, 1 when FILE is invalid.
    Diff {
        /// The policy file, YAML or JSON: {"policies": [...]}.
        file: std::path::PathBuf,
        /// Also list the policies FILE omits as deletions.
        #[arg(long)]
        prune: bool,
        /// Also replay the last DAYS days of the ledger (at most 31) against FILE's
        /// policies and print what they would have denied (the exit status stays the
        /// diff's).
        #[arg(long, value_name = "DAYS", value_parser = clap::value_parser!(u32).range(1..=31))]
        backtest: Option<u32>,
    },
    /// Create and update policies to match FILE, validating all of it first; exit 1 when
    /// FILE is invalid (nothing changed), 3 when a policy changed on the service meanwhile
    /// (not overwritten).
    Apply {
        /// The policy file, YAML or JSON: {"policies": [...]}.
        file: std::path::PathBuf,
        /// Also delete the policies FILE omits.
        #[arg(long)]
        prune: bool,
        /// Print the changes without making them.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// Create an API key confined to ACTIONS and OPERATIONS; prints the key (shown this
    /// once) on stdout, and the key as listed on stderr.
    Create {
        /// What the key is for.
        #[arg(long)]
        name: String,
        /// Action globs, comma-separated: `*` matches within one dot-separated segment
        /// (sms.*,transfer).
        #[arg(long, value_delimiter = ',', required = true)]
        actions: Vec<String>,
        /// Operations, comma-separated: consume, check, usage, refund, holds, ledger,
        /// admin:read. Default: all but admin:read.
        #[arg(long, value_delimiter = ',')]
        operations: Vec<String>,
        /// When the key expires (RFC 3339); default: never.
        #[arg(long, value_name = "TIME")]
        expires_at: Option<String>,
    },
    /// List every key (never a secret): id, state, prefix, name, actions, operations,
    /// expiry, last use.
    List,
    /// Revoke a key: every instance refuses it within a second.
    Revoke {
        /// The key's id (key_…).
        id: String,
    },
}

#[derive(Debug, Subcommand)]
enum CountersCommand {
    /// Rebuild every counter, open hold, kept answer and refunded total in Redis from the
    /// SQL ledger, then exit: after restoring Redis from an old backup, or fixing the ledger
    /// by hand. Safe while instances serve: each shard answers 503 (or degraded under
    /// QUOTA_ON_STORE_ERROR=allow) until it is rebuilt, never from stale counters.
    Rebuild {
        /// Rebuild only this action's counters, holds, kept answers and refunded totals.
        #[arg(long, value_name = "ACTION")]
        action: Option<String>,
    },
    /// Ask a running service to compare every live budget with the usage its ledger gives
    /// it, and print each one that drifts. Exits 0 when none does, 1 when some does, 2 when
    /// it cannot tell (the service unreachable, a store down). Uses QUOTA_ADMIN_TOKEN.
    Verify {
        /// Verify only this action's budgets.
        #[arg(long, value_name = "ACTION")]
        action: Option<String>,
        /// The service's base URL.
        #[arg(
            long,
            env = "QUOTA_URL",
            value_name = "URL",
            default_value = "http://127.0.0.1:8080"
        )]
        url: String,
    },
}

#[actix_web::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::Serve);
    if let Command::Openapi = command {
        print!("{}", quota_ledger::api::openapi::spec_json());
        return Ok(());
    }
    let settings = Settings::from_args(cli.config).context("reading the configuration")?;
    match command {
        Command::Openapi => Ok(()),
        Command::Policies {
            service: ServiceUrl { url },
            command,
        } => {
            let remote = admin_remote(&settings, &url)?;
            let exit = policies_command(&remote, command).await?;
            std::process::exit(exit as i32);
        }
        Command::Keys {
            service: ServiceUrl { url },
            command,
        } => {
            let remote = admin_remote(&settings, &url)?;
            match command {
                KeysCommand::Create {
                    name,
                    actions,
                    operations,
                    expires_at,
                } => {
                    let key = keys::NewKey {
                        name,
                        actions,
                        operations,
                        expires_at,
                    };
                    keys::create(&remote, &key).await
                }
                KeysCommand::List => keys::list(&remote).await,
                KeysCommand::Revoke { id } => keys::revoke(&remote, &id).await,
            }
        }
        Command::Webhooks {
            service: ServiceUrl { url },
            command,
        } => webhooks::run(&admin_remote(&settings, &url)?, command).await,
        Command::Counters(CountersCommand::Verify { action, url }) => {
            let verdict = match settings.admin_token.as_ref() {
                Some(token) => {
                    let remote = Remote::new(&url, token.expose())?;
                    counters::verify(&remote, action.as_deref()).await
                }
                None => {
                    eprintln!(
                        "cannot tell: QUOTA_ADMIN_TOKEN must be set to the service's admin token"
                    );
                    counters::Verdict::CannotTell
                }
            };
            std::process::exit(verdict as i32);
        }
        Command::Migrate => {
            let _telemetry = quota_ledger::telemetry::init(settings.log_json)?;
            quota_ledger::db::migrate_url(&settings.database_url).await?;
            quota_ledger::ledger::upgrade::upgrade_url(&settings.database_url).await?;
            tracing::info!("migrations applied");
            Ok(())
        }
        Command::Counters(CountersCommand::Rebuild { action }) => {
            let _telemetry = quota_ledger::telemetry::init(settings.log_json)?;
            rebuild_counters(settings, action).await
        }
        Command::Serve => serve(settings).await,
    }
}

/// The service at `url`, called with the admin token of `settings`.
fn admin_remote(settings: &Settings, url: &str) -> anyhow::Result<Remote> {
    let token = settings
        .admin_token
        .as_ref()
        .context("QUOTA_ADMIN_TOKEN must be set to the service's admin token")?;
    Remote::new(url, token.expose())
}

/// Serves the API until SIGTERM or SIGINT.
async fn serve(settings: Settings) -> anyhow::Result<()> {
    let telemetry = quota_ledger::telemetry::init(settings.log_json)?;
    let app = Application::build(settings).await?;
    let base = format!("http://127.0.0.1:{}", app.port());
    if app.admin_token_generated() {
        println!(
            "admin token (generated; set QUOTA_ADMIN_TOKEN to choose one): {}",
            app.admin_token().expose()
        );
    }
    println!(
        "quota-ledger listening on port {}; Swagger UI: {base}/swagger-ui/; console: {base}/console/",
        app.port()
    );
    let served = app.run_until_stopped().await.context("serving");
    telemetry.shutdown();
    served
}

/// `policies export | diff | apply`: the exit status (errors reaching or from the service
/// are returned, and exit 1).
async fn policies_command(remote: &Remote, command: PoliciesCommand) -> anyhow::Result<Exit> {
    let mut backtest = None;
    let (file, prune, dry_run, is_diff) = match command {
        PoliciesCommand::Export { json } => {
            print!("{}", policies::export(remote, json).await?);
            return Ok(Exit::Done);
        }
        PoliciesCommand::Diff {
            file,
            prune,
            backtest: days,
        } => {
            backtest = days;
            (file, prune, true, true)
        }
        PoliciesCommand::Apply {
            file,
            prune,
            dry_run,
        } => (file, prune, dry_run, false),
    };
    let desired = match policies::load(&file) {
        Ok(desired) => desired,
        Err(exit) => return Ok(exit),
    };
    let plan = policies::plan(remote, &desired, prune).await?;
    println!("{}", plan.describe());
    if let Some(days) = backtest {
        // Beside the diff: a backtest that fails is told, and the exit status stays the diff's.
        if let Err(error) = quota_ledger::cli::backtest::print(remote, &desired, days).await {
            eprintln!("backtest: {error:#}");
        }
    }
    if dry_run {
        return Ok(match is_diff && !plan.changes.is_empty() {
            true => Exit::Changes,
            false => Exit::Done,
        });
    }
    let applied = policies::execute(remote, &plan).await?;
    for line in &applied.done {
        println!("{line}");
    }
    match applied.conflict {
        Some(conflict) => {
            eprintln!("conflict: {conflict}; run `policies diff` again and re-apply");
            Ok(Exit::Conflict)
        }
        None => Ok(Exit::Done),
    }
}

/// `counters rebuild`: the service's own wiring (on a loopback port of its own, never
/// served), used to rebuild every shard from the ledger.
async fn rebuild_counters(mut settings: Settings, action: Option<String>) -> anyhow::Result<()> {
    let action = action
        .map(|action| quota_ledger::domain::Action::parse("--action", &action))
        .transpose()
        .map_err(|error| anyhow::anyhow!("{error}"))?;
    anyhow::ensure!(
        settings.uses_redis(),
        "REDIS_URL is not set: the in-process counters are rebuilt at every start"
    );
    settings.listen = "127.0.0.1:0".parse().context("a loopback address")?;
    let app = Application::build(settings).await?;
    let started = std::time::Instant::now();
    let rebuilt = app.engine().rebuild_counters(action.as_ref()).await?;
    println!(
        "rebuilt {} shards from {} ledger entries ({} keys written) in {:.1} s",
        rebuilt.shards.len(),
        rebuilt.entries,
        rebuilt.items,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Each `(variable, default)` of the configuration table in docs/configuration.md; the
    /// default is `None` where the table gives no literal value (`unset: …`, `text`).
    fn documented_variables() -> Vec<(&'static str, Option<&'static str>)> {
        include_str!("../docs/configuration.md")
            .lines()
            .filter_map(|row| {
                let mut cells = row.strip_prefix("| `")?.split(" | ");
                let name = cells.next()?.strip_suffix('`')?;
                let default = cells
                    .next()
                    .and_then(|d| d.strip_prefix('`')?.strip_suffix('`'));
                Some((name, default))
            })
            .collect()
    }

    fn help(args: &[&str]) -> String {
        let error = Cli::try_parse_from(args).expect_err("--help stops parsing");
        assert_eq!(error.kind(), clap::error::ErrorKind::DisplayHelp);
        error.render().to_string()
    }

    #[test]
    fn help_lists_every_documented_variable_with_its_default() {
        let variables = documented_variables();
        for name in [
            "QUOTA_LISTEN",
            "DATABASE_URL",
            "REDIS_URL",
            "QUOTA_ADMIN_TOKEN",
        ] {
            assert!(
                variables.iter().any(|(documented, _)| *documented == name),
                "docs/configuration.md lists {name}: {variables:?}"
            );
        }
        for args in [
            &["quota-ledger", "--help"][..],
            &["quota-ledger", "-h"],
            &["quota-ledger", "serve", "--help"],
        ] {
            let text = help(args);
            for (name, default) in &variables {
                let read_elsewhere = quota_ledger::config::READ_ELSEWHERE_HELP
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .any(|word| word == *name);
                if read_elsewhere {
                    assert!(text.contains(name), "{args:?} mentions {name}");
                    continue;
                }
                let line = text
                    .lines()
                    .find(|line| {
                        line.contains(&format!("[env: {name}]"))
                            || line.contains(&format!("[env: {name}="))
                    })
                    .unwrap_or_else(|| panic!("{args:?} lists {name}:\n{text}"));
                if let Some(default) = default {
                    assert!(
                        line.contains(&format!("[default: {default}]")),
                        "{args:?} gives {name} the default {default}: {line}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_variable_the_binary_reads_is_documented_in_the_configuration_page() {
        let documented: Vec<&str> = documented_variables().into_iter().map(|(n, _)| n).collect();
        let command = Cli::command();
        let read: Vec<String> = command
            .get_arguments()
            .filter_map(|arg| arg.get_env())
            .map(|env| env.to_string_lossy().into_owned())
            .collect();
        assert!(!read.is_empty());
        for name in &read {
            assert!(
                documented.contains(&name.as_str()),
                "{name} is missing from the table of docs/configuration.md"
            );
        }
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn counters_rebuild_takes_an_optional_action() {
        let parse = |args: &[&str]| match Cli::try_parse_from(args).map(|cli| cli.command) {
            Ok(Some(Command::Counters(CountersCommand::Rebuild { action }))) => action,
            other => panic!("{args:?}: {other:?}"),
        };
        assert_eq!(parse(&["quota-ledger", "counters", "rebuild"]), None);
        assert_eq!(
            parse(&["quota-ledger", "counters", "rebuild", "--action", "sms"]),
            Some("sms".to_owned())
        );
    }
}
