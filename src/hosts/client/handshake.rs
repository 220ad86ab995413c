//! Starting a host's agent through its transport and reading its hello: the kept ssh
//! connection decided, the push script's questions answered with this gpuloop's copy, the
//! protocol checked, and the connection handed its pipes.

use super::conn::{quote, read_line, read_stderr, truncate, Agent, Conn, Stderr};
use super::{lock, CLOSE_WAIT};
use crate::hosts::protocol::{self, Hello, Message};
use crate::hosts::{push, HostError, Transport};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::Semaphore;

/// Starts the agent and reads its hello; where the host's own gpuloop speaks another
/// protocol and gpuloop is pushed, again with this one's copy.
pub(super) async fn connect(
    host: &str,
    transport: &Transport,
    timeout: Duration,
    answer_within: Duration,
    shard: usize,
    stop: &Semaphore,
) -> Result<Conn, HostError> {
    let started = Instant::now();
    match connect_once(host, transport, timeout, answer_within, shard, false, stop).await {
        Err(HostError::PushNeeded { .. }) => {
            let left = timeout.saturating_sub(started.elapsed());
            connect_once(host, transport, left, answer_within, shard, true, stop).await
        }
        r => r,
    }
}

/// What to write to a push script's question `line` (`None`: it is no question): the
/// binary's hash, or its size and bytes; an error where this binary cannot go there.
fn push_answer(line: &str) -> Option<Result<Vec<u8>, String>> {
    if let Some(said) = line.strip_prefix(push::ASK) {
        return Some(
            push::exe().and_then(|exe| match push::cannot_run(said, &exe) {
                Some(why) => Err(why),
                None => Ok(format!("{}\n", exe.hash).into_bytes()),
            }),
        );
    }
    if let Some(how) = line.strip_prefix(push::SEND) {
        return Some(push::exe().map(|exe| {
            let (body, format) = exe.for_host(how);
            let mut b = format!("{} {format}\n", body.len()).into_bytes();
            b.extend_from_slice(body);
            b
        }));
    }
    None
}

/// One try at `host`: the transport started, the agent's hello read and its protocol
/// checked (`skip_path`: the host's own gpuloop is passed over for this one's copy).
async fn connect_once(
    host: &str,
    transport: &Transport,
    timeout: Duration,
    answer_within: Duration,
    shard: usize,
    skip_path: bool,
    stop: &Semaphore,
) -> Result<Conn, HostError> {
    let started = Instant::now();
    let mux = keep_connection(host, transport, timeout, stop).await?;
    let timeout = timeout.saturating_sub(started.elapsed());
    if stop.is_closed() {
        return Err(HostError::Interrupted);
    }
    let launch = transport.launch(host, mux, skip_path)?;
    tracing::debug!("host {host}: {} {}", launch.program, launch.args.join(" "));
    let (mut agent, stderr_task) = start_agent(host, &launch, transport.death_signal())?;
    let first = tokio::select! {
        biased;
        _ = stopped(stop) => {
            // Killed and reaped here: nothing this run started outlives it.
            let _ = agent.child.start_kill();
            let _ = tokio::time::timeout(CLOSE_WAIT, agent.child.wait()).await;
            crate::process::helpers::forget(agent.helper);
            return Err(HostError::Interrupted);
        }
        first = tokio::time::timeout(
            timeout,
            first_line(host, transport, &mut agent.stdout, &mut agent.stdin),
        ) => first,
    };
    let hello = hello_in(host, transport, first, &mut agent, stderr_task, timeout).await?;
    if let Err(e) = same_protocol(host, transport, &hello, skip_path) {
        let _ = agent.child.start_kill();
        return Err(e);
    }
    lock(&agent.stderr).echo = true;
    Ok(Conn::start(
        host,
        hello,
        agent,
        transport,
        answer_within,
        shard,
    ))
}

/// Whether gpuloop keeps this host's ssh connection between runs.
async fn keep_connection(
    host: &str,
    transport: &Transport,
    timeout: Duration,
    stop: &Semaphore,
) -> Result<bool, HostError> {
    // A connection is kept between runs only where the user's ssh config keeps none itself
    // (its own ControlPath wins); ssh -G says, without connecting. A socket already there
    // is one an earlier run decided on: used without asking again (a ControlPath added to
    // the config since then wins once that master has gone, ControlPersist after its use).
    Ok(
        match (transport.kept_socket(host), transport.show_config(host)) {
            (Some(sock), _) if sock.exists() => true,
            (_, Some(g)) => tokio::select! {
                // The interrupt first: polled first, `ssh -G` would be started only to be
                // killed.
                biased;
                _ = stopped(stop) => return Err(HostError::Interrupted),
                // Dropped, `ssh -G` is killed (and reaped by tokio).
                shown = output_of(&g, timeout) => {
                    shown.is_some_and(|shown| !crate::hosts::transport::sets_control_path(&shown))
                }
            },
            _ => false,
        },
    )
}

/// A command of the transport's, started apart from gpuloop: in a session of its own, dying
/// with gpuloop (`death`; `helpers::apart_hook` says why).
fn apart(program: &str, death: rustix::process::Signal) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(program);
    cmd.kill_on_drop(true);
    // SAFETY: the hook only makes async-signal-safe system calls and allocates nothing.
    unsafe { cmd.pre_exec(crate::process::helpers::apart_hook(death)) };
    cmd
}

/// Starts the transport (ssh, srun, …) that runs the agent, with its stderr read from now on.
/// It runs in a session of its own (so a Ctrl-C at the terminal, gpuloop's to handle, cannot
/// cut every link; `apart`).
fn start_agent(
    host: &str,
    launch: &crate::hosts::transport::Launch,
    death: rustix::process::Signal,
) -> Result<(Agent, tokio::task::JoinHandle<()>), HostError> {
    let mut cmd = apart(&launch.program, death);
    for v in &launch.env_remove {
        cmd.env_remove(v);
    }
    cmd.args(&launch.args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // A child outside gpuloop's process group: registered as gpuloop's own before anything
    // can see it, or the runner would stop it as a local job's orphan.
    let (mut child, helper) =
        crate::process::helpers::start(|| cmd.spawn(), |c| c.id()).map_err(|e| {
            HostError::Connect {
                host: host.to_string(),
                why: format!("cannot start {}: {e}", launch.program),
            }
        })?;
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(HostError::Connect {
            host: host.to_string(),
            why: "no pipes to the transport".into(),
        });
    };
    let err_state = Arc::new(Mutex::new(Stderr::default()));
    let stderr_task = tokio::spawn(read_stderr(host.to_string(), stderr, err_state.clone()));
    let agent = Agent {
        child,
        helper,
        stdin,
        stdout: BufReader::new(stdout),
        stderr: err_state,
    };
    Ok((agent, stderr_task))
}

/// The agent's first line, which should be its hello; where gpuloop is pushed, the push
/// script's questions may come first, and are answered here (`push`). An error where this
/// gpuloop cannot be sent; `Ok(Ok(None))` where the link ended first.
async fn first_line(
    host: &str,
    transport: &Transport,
    stdout: &mut BufReader<ChildStdout>,
    stdin: &mut ChildStdin,
) -> Result<std::io::Result<Option<String>>, HostError> {
    loop {
        let line = read_line(stdout, 64 * 1024).await;
        let Ok(Some(l)) = &line else { return Ok(line) };
        let Some(answer) = transport.pushes().then(|| push_answer(l)).flatten() else {
            return Ok(line);
        };
        let answer = answer.map_err(|why| HostError::NoAgent {
            host: host.to_string(),
            why: format!(
                "gpuloop is not installed there, and this one cannot be sent: {why}; install gpuloop there or give --remote-bin PATH"
            ),
        })?;
        // A write that fails means the session ended: its reading says why.
        if stdin.write_all(&answer).await.is_err() || stdin.flush().await.is_err() {
            return Ok(Ok(None));
        }
    }
}

/// The hello in what `first_line` read within `timeout` (`Err`: nothing in time), or why
/// there is none: no answer, not an agent, or the link closed first (then what the transport
/// said, and its exit code, tell why).
async fn hello_in(
    host: &str,
    transport: &Transport,
    first: Result<Result<std::io::Result<Option<String>>, HostError>, tokio::time::error::Elapsed>,
    agent: &mut Agent,
    stderr_task: tokio::task::JoinHandle<()>,
    timeout: Duration,
) -> Result<Hello, HostError> {
    let program = transport.program();
    let child = &mut agent.child;
    let first = match first {
        Ok(Err(e)) => {
            let _ = child.start_kill();
            return Err(e);
        }
        Ok(Ok(line)) => Ok(line),
        Err(e) => Err(e),
    };
    let said = |st: &Arc<Mutex<Stderr>>| lock(st).tail.clone();
    let err_state = &agent.stderr;
    Ok(match first {
        Err(_) => {
            // (A kept connection whose host went away holds each run only this long, and
            // its own keepalives end it soon after: it is never ended from here, where it
            // may serve other runs, or other hosts' sessions behind one alias.)
            let _ = child.start_kill();
            return Err(HostError::Connect {
                host: host.to_string(),
                why: format!(
                    "no answer within {:.0}s{}",
                    timeout.as_secs_f64(),
                    quote(program, &said(err_state))
                ),
            });
        }
        Ok(Ok(Some(line))) => match Message::read(&line) {
            Ok(Message::Hello(h)) => h,
            _ => {
                let _ = child.start_kill();
                return Err(HostError::Protocol {
                    host: host.to_string(),
                    why: format!(
                        "expected the agent's hello, got {:?} (is --remote-bin a gpuloop?)",
                        truncate(&line, 200)
                    ),
                });
            }
        },
        Ok(_) => {
            // Closed before hello: ssh failed, or the remote command did.
            let code = tokio::time::timeout(Duration::from_secs(5), child.wait())
                .await
                .ok()
                .and_then(|s| s.ok())
                .and_then(|s| s.code());
            let _ = tokio::time::timeout(Duration::from_secs(2), stderr_task).await;
            if code == Some(push::CANNOT_STORE) && transport.pushes() {
                return Err(HostError::NoAgent {
                    host: host.to_string(),
                    why: format!(
                        "gpuloop is not installed there, and this one could not be stored in its cache{}",
                        quote(program, &said(err_state))
                    ),
                });
            }
            return Err(transport.classify(host, code, &said(err_state)));
        }
    })
}

/// Refuses an agent that speaks another protocol; where gpuloop is pushed, with the error
/// that sends this one's copy instead (`HostError::PushNeeded`).
fn same_protocol(
    host: &str,
    transport: &Transport,
    hello: &Hello,
    skip_path: bool,
) -> Result<(), HostError> {
    if hello.protocol != protocol::PROTOCOL && transport.pushes() && !skip_path {
        // Its own gpuloop speaks another protocol: this one's copy will do.
        return Err(HostError::PushNeeded {
            host: host.to_string(),
            theirs: hello.version.clone(),
            their_protocol: hello.protocol,
        });
    }
    if hello.protocol != protocol::PROTOCOL {
        return Err(HostError::Version {
            host: host.to_string(),
            theirs: hello.version.clone(),
            their_protocol: hello.protocol,
            ours: env!("CARGO_PKG_VERSION").into(),
            our_protocol: protocol::PROTOCOL,
        });
    }
    Ok(())
}

/// Returns once the opening of the hosts is to stop (`stop` closed on an interrupt).
pub(super) async fn stopped(stop: &Semaphore) {
    // No permit is ever added: the wait ends only when the semaphore is closed.
    let _ = stop.acquire().await;
}

/// A short command's stdout, or `None` if it failed or outlived `within` (then it is killed).
async fn output_of(l: &crate::hosts::transport::Launch, within: Duration) -> Option<String> {
    let mut cmd = apart(&l.program, rustix::process::Signal::KILL);
    cmd.args(&l.args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let (child, helper) = crate::process::helpers::start(|| cmd.spawn(), |c| c.id()).ok()?;
    let out = tokio::time::timeout(within, child.wait_with_output()).await;
    // Reaped by wait_with_output, or killed and reaped on drop by tokio.
    crate::process::helpers::forget(helper);
    match out {
        Ok(Ok(o)) if o.status.success() => Some(String::from_utf8_lossy(&o.stdout).into_owned()),
        _ => None,
    }
}
