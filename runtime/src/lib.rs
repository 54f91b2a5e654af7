//! What every Crescent program shares at run time.
//!
//! Owns the process-level plumbing of the binaries (`crescent-master`,
//! `crescent-store`, `crescentctl`, `crescent-chaos`): logging set-up,
//! the shutdown and reload (SIGHUP) signals, raising the open-file limit,
//! turning transparent huge pages off for a process, and the listeners'
//! connection caps with the admin HTTP server that uses them.
//!
//! It must not hold Crescent behaviour (metadata, placement, the data
//! path), and the library an engine links must not use it: `crescent-client`
//! depends on it only for the binaries that still live in that crate.

pub mod conn_limit;

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Logs of a long-running server to stdout: `format` is `text` or `json`;
/// `RUST_LOG` overrides `default_filter`.
pub fn init_server_logging(format: &str, default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    // Colours only on a terminal: escape codes in a log file or journal
    // break every search through it.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal());
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Logs of a command-line tool to stderr, so they never mix with its
/// output; `RUST_LOG` overrides `default_filter`.
pub fn init_tool_logging(default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

/// Runs a command-line tool's `main` on a multi-threaded runtime: exit
/// status 0 when it returns Ok, else 1 with `error: ...` on stderr.
pub fn run_tool<E: std::fmt::Display>(
    main: impl std::future::Future<Output = Result<(), E>>,
) -> std::process::ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(main) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Resolves at the first SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {},
                _ = term.recv() => {},
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGTERM; stopping on SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Runs `reload` at every SIGHUP, from now on (must be called inside a
/// Tokio runtime). Without the handler a SIGHUP would end the process.
pub fn on_hangup(reload: impl Fn() + Send + 'static) {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::hangup()) {
        Ok(mut hup) => {
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    reload();
                }
            });
        }
        Err(e) => tracing::warn!(error = %e, "cannot watch SIGHUP; reloading needs a restart"),
    }
}

/// Raises this process's soft limit on open files to its hard limit and
/// warns when the result is below `needed` (the connection caps plus a
/// reserve): the usual soft limit of 1,024 would run out long before a
/// listener's cap of 4,096 connections, and `accept` would fail with "Too
/// many open files" instead of the cap closing the newest connection.
/// Returns the soft limit now in force, or `None` (logged) when it cannot
/// be read.
pub fn raise_open_file_limit(needed: u64) -> Option<u64> {
    match try_raise_open_file_limit(needed) {
        Ok(soft) => Some(soft),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the open-file limit");
            None
        }
    }
}

/// Turns transparent huge pages off for this process
/// (`prctl(PR_SET_THP_DISABLE)`), unless `MIMALLOC_ALLOW_THP` is set: for
/// a process whose global allocator is mimalloc (the master), that
/// variable already told mimalloc what to do.
///
/// Why: mimalloc marks its arenas `MADV_HUGEPAGE`, so where THP is
/// `madvise` (the usual default) each fresh span of its heap faults in a
/// whole 2 MiB page and zeroes it. A profile of batch-128 puts found about
/// 30 % of the masters' time in that zeroing; with THP off, six
/// alternating runs of 3-node batch-128 puts averaged 69 k objects/s
/// against 55 k, p99 median 24 ms against 48, and single puts were
/// unchanged (docs/benchmarks-history.md). Returns whether this call
/// turned it off.
pub fn disable_transparent_huge_pages() -> bool {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
        return false;
    }
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments and sets a flag
    // of the calling process; no memory is passed.
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if rc != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "cannot turn transparent huge pages off");
    }
    rc == 0
}

fn try_raise_open_file_limit(needed: u64) -> std::io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read or write the struct passed.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim = raised;
        } else {
            tracing::warn!(error = %std::io::Error::last_os_error(), "cannot raise the open-file limit");
        }
    }
    let soft: u64 = lim.rlim_cur;
    if soft < needed {
        tracing::warn!(
            open_file_limit = soft,
            needed,
            "the open-file limit is below the connection caps plus a reserve; raise `ulimit -n` (or the container's nofile) or lower the caps"
        );
    }
    Ok(soft)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_open_file_limit_is_raised_to_the_hard_limit() {
        let soft = super::raise_open_file_limit(0).unwrap();
        assert!(soft > 0);
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!(lim.rlim_cur, lim.rlim_max);
        assert_eq!(soft, lim.rlim_cur);
    }

    #[test]
    fn transparent_huge_pages_are_turned_off_unless_mimalloc_is_told() {
        let turned_off = super::disable_transparent_huge_pages();
        // SAFETY: PR_GET_THP_DISABLE takes integer arguments only.
        let flag = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
            assert!(!turned_off, "MIMALLOC_ALLOW_THP is left to mimalloc");
        } else if flag < 0 {
            // A kernel (or sandbox) without the flag: the master runs on and
            // says so, and the function must not claim it turned THP off.
            assert!(!turned_off, "prctl refused, yet reported as done");
        } else {
            assert!(turned_off);
            assert_eq!(flag, 1, "the process's THP flag is set");
        }
    }
}
