//! `routerd [check-config] [--config PATH]... [--log-format text|json]`

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use routerd::config::{default_config_path, FacilitatorSettings, Settings, StorageBackend};
use routerd::facilitator::deny_list;
use routerd::facilitator::svm::FeePayers;
use routerd::signer::{load_authorizer, load_signers};
use routerd::store::postgres::PgStore;
use routerd::telemetry::Telemetry;

const USAGE: &str = "usage: routerd [check-config] [--config PATH]... [--log-format text|json]";

enum Command {
    Run,
    CheckConfig,
}

struct Cli {
    command: Command,
    configs: Vec<PathBuf>,
    json_logs: bool,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Option<Cli>, String> {
    let mut cli = Cli {
        command: Command::Run,
        configs: Vec::new(),
        json_logs: false,
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "check-config" => cli.command = Command::CheckConfig,
            "--config" | "-c" => cli
                .configs
                .push(args.next().ok_or("--config needs a path")?.into()),
            "--log-format" => match args.next().as_deref() {
                Some("json") => cli.json_logs = true,
                Some("text") => cli.json_logs = false,
                _ => return Err("--log-format takes text or json".to_string()),
            },
            "--version" | "-V" => {
                println!("routerd {}", env!("CARGO_PKG_VERSION"));
                return Ok(None);
            }
            "--help" | "-h" => {
                println!("{USAGE}");
                return Ok(None);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if cli.configs.is_empty() {
        cli.configs.push(default_config_path().to_path_buf());
    }
    Ok(Some(cli))
}

/// Prints the effective configuration and the signer addresses (keys are never printed); a
/// facilitator without a usable key is a configuration error like any other.
fn check_config(settings: &Settings) -> ExitCode {
    print!("{}", settings.render());
    if let Some(facilitator) = &settings.facilitator {
        if let Err(error) = show_keys(facilitator).and_then(|()| show_deny_list(facilitator)) {
            eprintln!("routerd: bad configuration: {error}");
            return ExitCode::from(2);
        }
    }
    check_storage(settings)
}

/// The public halves of the keys the facilitator needs: EVM signer addresses with an EVM
/// network, the receiver authorizer's address when its key is configured, Solana fee payers
/// with a Solana one.
fn show_keys(facilitator: &FacilitatorSettings) -> Result<(), String> {
    if facilitator.evm_networks().next().is_some() {
        let signers = load_signers(&facilitator.signer_key_file).map_err(|e| e.to_string())?;
        let addresses: Vec<String> = signers
            .iter()
            .map(|s| routerd::evm::hex_bytes(s.address))
            .collect();
        println!(
            "\n# signer keys: redacted; signer addresses: {}",
            addresses.join(", ")
        );
    }
    if let Some(authorizer) =
        load_authorizer(&facilitator.receiver_authorizer_key_file).map_err(|e| e.to_string())?
    {
        println!(
            "# receiver authorizer key: redacted; receiver authorizer address: {}",
            routerd::evm::hex_bytes(authorizer.address())
        );
    }
    if !facilitator.solana_networks().is_empty() {
        let fee_payers =
            FeePayers::load(&facilitator.svm_fee_payer_key_file).map_err(|e| e.to_string())?;
        let pubkeys: Vec<String> = fee_payers.pubkeys().iter().map(|p| p.to_string()).collect();
        println!(
            "# Solana fee payer keys: redacted; fee payers: {}",
            pubkeys.join(", ")
        );
    }
    Ok(())
}

/// How many addresses of each family the deny list file gave, and from which format.
fn show_deny_list(facilitator: &FacilitatorSettings) -> Result<(), String> {
    if facilitator.deny_list_file.is_empty() {
        return Ok(());
    }
    let loaded = deny_list::load(&facilitator.deny_list_file)
        .map_err(|e| format!("facilitator.deny_list_file: {e}"))?;
    println!("# facilitator.deny_list_file: {}", loaded.summary());
    Ok(())
}

/// With a shared database: connects (changing nothing) and says whether it could.
fn check_storage(settings: &Settings) -> ExitCode {
    let (StorageBackend::Postgres, Some(url)) =
        (settings.storage.backend, &settings.storage.postgres_url)
    else {
        return ExitCode::SUCCESS;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("starting the tokio runtime");
    match runtime.block_on(PgStore::probe(url.expose())) {
        Ok((database, server, schema)) => {
            println!(
                "\n# storage: connected to {database} (PostgreSQL {server}); schema version {schema}, this routerd migrates to {}",
                PgStore::schema_version()
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("routerd: storage.postgres_url: cannot connect: {error}");
            ExitCode::from(1)
        }
    }
}

/// glibc serves an allocation of 128 KiB or more by its own mapping, returned when freed, but
/// after the first such free it raises that bound to the freed size, and from then on sled's
/// 512 KiB write buffers and a full block's receipts come from the heap, whose pages stay
/// resident after use. A fixed bound keeps them apart: 4 to 6 MiB less at the peak of a
/// 1,000-settlement burst (`scripts/bench`), for an mmap and munmap per large buffer.
fn large_allocations_apart() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; it runs before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

/// glibc gives each new thread that allocates an arena of its own, up to eight per core:
/// sled's threads and the blocking pool's (each flush) each keep one, with the pages their
/// bursts touched and freed. Two arenas more than runtime threads (the main thread's, and one
/// that the threads outside the runtime share) keeps the others sharing, for less at the peak
/// of a 1,000-settlement burst (`scripts/bench --only settle`, docs/benchmarks.md), and leaves
/// each runtime thread an arena of its own: with only as many arenas as runtime threads, the
/// two runtime threads of a two-core host shared one and waited on its lock, about a tenth of
/// verify's throughput (`scripts/bench --only verify`).
fn arenas_per_runtime_thread(threads: usize) {
    let tunables = std::env::var_os("GLIBC_TUNABLES");
    let Some(bound) = arena_bound(threads, std::env::var_os("MALLOC_ARENA_MAX"), tunables) else {
        return;
    };
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; it runs before any thread starts.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, bound);
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = bound;
}

/// The arena bound to set for `threads` runtime threads; none when the operator's environment
/// bounds the arenas already (`MALLOC_ARENA_MAX`, or `glibc.malloc.arena_max` in
/// `GLIBC_TUNABLES`): glibc has read that, and routerd's bound would override it.
fn arena_bound(
    threads: usize,
    arena_max: Option<OsString>,
    tunables: Option<OsString>,
) -> Option<i32> {
    let tunables = tunables.unwrap_or_default();
    if arena_max.is_some() || tunables.to_string_lossy().contains("arena_max") {
        return None;
    }
    Some(i32::try_from(threads.saturating_add(2)).unwrap_or(i32::MAX))
}

fn main() -> ExitCode {
    large_allocations_apart();
    let cli = match parse_args(std::env::args().skip(1)) {
        Ok(Some(cli)) => cli,
        Ok(None) => return ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("routerd: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let settings = match Settings::load(&cli.configs) {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("routerd: bad configuration: {error}");
            return ExitCode::from(2);
        }
    };
    if let Command::CheckConfig = cli.command {
        return check_config(&settings);
    }
    arenas_per_runtime_thread(settings.server.worker_threads());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(settings.server.worker_threads())
        .enable_all()
        .build()
        .expect("starting the tokio runtime");
    // The trace exporter runs on the runtime: it is started inside it.
    let telemetry =
        match runtime.block_on(async { Telemetry::init(cli.json_logs, &settings.telemetry) }) {
            Ok(telemetry) => telemetry,
            Err(error) => {
                eprintln!("routerd: bad configuration: {error}");
                return ExitCode::from(2);
            }
        };
    if telemetry.exporting() {
        tracing::info!("telemetry: exporting traces over OTLP/HTTP");
    }
    let exit = match runtime.block_on(routerd::daemon::run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("cannot start: {error}");
            eprintln!("routerd: {error}");
            ExitCode::from(error.exit_code())
        }
    };
    telemetry.shutdown();
    exit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_arenas_more_than_runtime_threads_unless_the_operator_bounds_them() {
        assert_eq!(arena_bound(2, None, None), Some(4));
        let other = Some(OsString::from("glibc.malloc.tcache_count=0"));
        assert_eq!(arena_bound(4, None, other), Some(6));
        assert_eq!(arena_bound(2, Some(OsString::from("8")), None), None);
        let tunables = Some(OsString::from("glibc.malloc.arena_max=8"));
        assert_eq!(arena_bound(2, None, tunables), None);
    }
}
