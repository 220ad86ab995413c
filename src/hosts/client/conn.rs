//! One open agent: calls with ids and deadlines (pinged while they wait, cancelled on
//! Ctrl-C), and the tasks that write its requests and read its replies, its jobs' output and
//! its stderr.

use super::{lock, TICK};
use crate::hosts::protocol::{
    self, Answered, Body, Call, Hello, Message, Request, Stream, WireError,
};
use crate::hosts::{HostError, Transport};
use crate::input::{LineBuf, TooLarge};
use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

/// How much of what ssh (or the agent) printed on stderr is kept for error messages.
const STDERR_KEEP: usize = 4096;
/// How often a call still waiting pings its host (a ping unanswered for the host timeout
/// means the host hangs, however long the call itself may take).
const PROBE_EVERY: Duration = Duration::from_secs(5);

/// What a call waits for: its result, or the agent's error.
pub(super) type Answer = Result<Answered, WireError>;

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Answer>>>>;

/// Job output not yet printed: the partial last line of each (request id, stdout?), and
/// the spawned jobs, whose output outlives their spawn's reply.
#[derive(Default)]
pub(super) struct Partial {
    pub(super) lines: HashMap<(u64, bool), String>,
    pub(super) spawned: std::collections::HashSet<u64>,
}

impl Partial {
    /// Prints what is left of request `id`'s output.
    pub(super) fn flush(&mut self, host: &str, id: u64) {
        for out in [true, false] {
            if let Some(mut buf) = self.lines.remove(&(id, out)) {
                print_lines(host, out, &mut buf, true);
            }
        }
    }
}

/// What the agent printed on stderr: kept before hello (it is what ssh or srun said), echoed with
/// the host's name after.
#[derive(Default)]
pub(super) struct Stderr {
    pub(super) tail: String,
    pub(super) echo: bool,
}

/// One open agent.
pub(crate) struct Conn {
    pub(super) host: String,
    pub(super) hello: Hello,
    pub(super) next_id: AtomicU64,
    pub(super) writer: Mutex<Option<mpsc::UnboundedSender<String>>>,
    pub(super) pending: Pending,
    pub(super) partial: Arc<Mutex<Partial>>,
    /// Why the connection ended, once it has.
    pub(super) dead: Arc<Mutex<Option<String>>>,
    /// How long the host may take to answer (a ping, or a call beyond its own time).
    pub(super) answer_within: Duration,
    /// A call timed out: the host hangs. Later calls fail at once, and the session's end
    /// does not wait for this agent.
    pub(super) hung: AtomicBool,
    pub(super) child: Mutex<Option<tokio::process::Child>>,
    /// The transport is one of gpuloop's own helpers under this identity: the runner never
    /// takes it for a local job's orphan.
    pub(super) helper: Option<crate::process::Identity>,
    /// The runtime (of `Pool::shards`) its reader, writer and calls run on.
    pub(super) shard: usize,
}

/// An agent's process and its pipes, as the handshake hands them over.
pub(super) struct Agent {
    pub(super) child: tokio::process::Child,
    /// The transport's identity as one of gpuloop's own helpers.
    pub(super) helper: Option<crate::process::Identity>,
    pub(super) stdin: tokio::process::ChildStdin,
    pub(super) stdout: BufReader<tokio::process::ChildStdout>,
    /// What it printed on stderr, read by its own task.
    pub(super) stderr: Arc<Mutex<Stderr>>,
}

impl Conn {
    /// The connection over an agent that said `hello`: how this side names the host is sent
    /// first, then one task writes the requests and one reads the replies.
    pub(super) fn start(
        host: &str,
        hello: Hello,
        agent: Agent,
        transport: &Transport,
        answer_within: Duration,
        shard: usize,
    ) -> Conn {
        let Agent {
            child,
            helper,
            stdin,
            stdout,
            stderr: err_state,
        } = agent;
        let (wtx, wrx) = mpsc::unbounded_channel::<String>();
        // First of all, how this side names the host: the agent's advice then says
        // `gpuloop --host NAME …`, never a bare command that would act on the GPUs here.
        let reached = Request {
            id: REACHED_ID,
            call: Call::ReachedAs {
                host: host.to_string(),
                gpuloop: transport.gpuloop_for(host),
            },
        };
        if let Ok(line) = serde_json::to_string(&reached) {
            let _ = wtx.send(line);
        }
        tokio::spawn(write_lines(stdin, wrx));
        let pending: Pending = Arc::default();
        let partial: Arc<Mutex<Partial>> = Arc::default();
        let dead = Arc::new(Mutex::new(None));
        tokio::spawn(read_replies(
            host.to_string(),
            transport.program(),
            stdout,
            pending.clone(),
            partial.clone(),
            dead.clone(),
            err_state,
        ));
        Conn {
            host: host.to_string(),
            hello,
            next_id: AtomicU64::new(1),
            writer: Mutex::new(Some(wtx)),
            pending,
            partial,
            dead,
            answer_within,
            hung: AtomicBool::new(false),
            child: Mutex::new(Some(child)),
            helper,
            shard,
        }
    }

    pub(super) async fn call(
        &self,
        call: Call,
        deadline: Option<Duration>,
        interrupted: &'static AtomicBool,
    ) -> Result<Answered, HostError> {
        let method = call.method().to_string();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let crate::hosts::protocol::Handling {
            stopped_there,
            reports_interrupt,
            ..
        } = call.handling();
        let mut cancelled = false;
        if matches!(call, Call::Spawn(_)) {
            lock(&self.partial).spawned.insert(id);
        }
        let (tx, mut rx) = oneshot::channel();
        lock(&self.pending).insert(id, tx);
        let line =
            serde_json::to_string(&Request { id, call }).map_err(|e| HostError::Protocol {
                host: self.host.clone(),
                why: format!("cannot encode the request: {e}"),
            })?;
        if let Some(why) = lock(&self.dead).clone() {
            lock(&self.pending).remove(&id);
            return Err(self.lost(&method, why));
        }
        if self.hung.load(Ordering::Relaxed) {
            lock(&self.pending).remove(&id);
            return Err(self.timeout(method, self.answer_within));
        }
        if !self.send(line) {
            lock(&self.pending).remove(&id);
            return Err(self.lost(&method, "the connection is closed".into()));
        }
        let now = tokio::time::Instant::now();
        let end = deadline.map(|d| now + d);
        let probe_every = PROBE_EVERY.min(self.answer_within);
        let mut next_probe = now + probe_every;
        // The ping in flight, and when it was sent.
        let mut probe: Option<(oneshot::Receiver<Answer>, tokio::time::Instant)> = None;
        // Its first tick is one TICK away (a plain interval's first tick is at once).
        let mut tick = tokio::time::interval_at(now + TICK, TICK);
        loop {
            tokio::select! {
                body = &mut rx => {
                    return match body {
                        Ok(Ok(v)) => Ok(v),
                        Ok(Err(e)) => Err(HostError::Remote {
                            host: self.host.clone(),
                            usage: e.kind == protocol::ErrorKind::Usage,
                            message: e.message,
                        }),
                        Err(_) => {
                            let why = lock(&self.dead).clone().unwrap_or_else(|| "the agent went away".into());
                            Err(self.lost(&method, why))
                        }
                    };
                }
                _ = tick.tick() => {
                    let now = tokio::time::Instant::now();
                    let mut hangs = false;
                    if let Some((prx, sent)) = &mut probe {
                        match prx.try_recv() {
                            Ok(_) => {
                                probe = None;
                                next_probe = now + probe_every;
                            }
                            Err(oneshot::error::TryRecvError::Empty) => hangs = now - *sent >= self.answer_within,
                            // The link ended: the call's own channel says so.
                            Err(oneshot::error::TryRecvError::Closed) => {}
                        }
                    } else if now >= next_probe {
                        probe = self.ping().map(|r| (r, now));
                    }
                    let late = hangs || end.is_some_and(|e| now >= e);
                    let stop = late || interrupted.load(Ordering::Relaxed);
                    if stop && reports_interrupt && !cancelled {
                        cancelled = true;
                        self.cancel(id);
                    }
                    // An interrupted kill waits on for the agent's report; anything late
                    // (and any other call) ends here.
                    if late || (stop && !reports_interrupt) {
                        lock(&self.pending).remove(&id);
                        if stopped_there {
                            self.cancel(id);
                        }
                        if late {
                            self.hung.store(true, Ordering::Relaxed);
                            let waited = match hangs {
                                true => self.answer_within,
                                false => deadline.unwrap_or_default(),
                            };
                            return Err(self.timeout(method, waited));
                        }
                        return Err(HostError::Interrupted);
                    }
                }
            }
        }
    }

    /// Asks the agent to stop request `id` (its answer to this is not awaited).
    fn cancel(&self, id: u64) {
        if let Ok(l) = serde_json::to_string(&Request {
            id: id | CANCEL_BIT,
            call: Call::Cancel { id },
        }) {
            self.send(l);
        }
    }

    /// Sends a ping; its answer comes on the receiver.
    fn ping(&self) -> Option<oneshot::Receiver<Answer>> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) | PING_BIT;
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id, tx);
        let line = serde_json::to_string(&Request {
            id,
            call: Call::Ping,
        })
        .ok()?;
        self.send(line).then_some(rx)
    }

    fn timeout(&self, method: String, waited: Duration) -> HostError {
        HostError::Timeout {
            host: self.host.clone(),
            method,
            secs: waited.as_secs_f64(),
        }
    }

    fn send(&self, line: String) -> bool {
        lock(&self.writer)
            .as_ref()
            .is_some_and(|w| w.send(line).is_ok())
    }

    fn lost(&self, method: &str, why: String) -> HostError {
        HostError::Lost {
            host: self.host.clone(),
            method: method.to_string(),
            why,
        }
    }
}

/// Cancel requests and pings get ids of their own, apart from the calls' ids.
const CANCEL_BIT: u64 = 1 << 62;
const PING_BIT: u64 = 1 << 61;
/// `reached_as`'s id: its answer is not awaited.
const REACHED_ID: u64 = 1 << 60;

/// `; ssh said: LAST LINE` (or srun), or nothing when it said nothing.
pub(super) fn quote(program: &str, said: &str) -> String {
    let s = said.trim();
    match s.lines().last() {
        Some(last) if !s.is_empty() => format!("; {program} said: {last}"),
        _ => String::new(),
    }
}

pub(super) fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// One line, without its newline; `Ok(None)` at EOF. A line longer than `max` is an error
/// as soon as it is (read by `input::LineBuf`, as every bounded line is).
pub(super) async fn read_line<R: AsyncRead + Unpin>(
    r: &mut BufReader<R>,
    max: usize,
) -> std::io::Result<Option<String>> {
    let mut line = LineBuf::new(max);
    let mut buf = loop {
        let chunk = r.fill_buf().await?;
        if chunk.is_empty() {
            match line.end() {
                None => return Ok(None),
                Some(l) => break l,
            }
        }
        let (used, ended) = line.feed(chunk);
        r.consume(used);
        if line.is_over() {
            break Err(TooLarge);
        }
        if let Some(l) = ended {
            break l;
        }
    }
    .map_err(|TooLarge| std::io::Error::other(format!("a line longer than {max} bytes")))?;
    while buf.last().is_some_and(|b| *b == b'\r') {
        buf.pop();
    }
    Ok(Some(String::from_utf8(buf).unwrap_or_else(|e| {
        String::from_utf8_lossy(e.as_bytes()).into_owned()
    })))
}

async fn write_lines(
    mut stdin: tokio::process::ChildStdin,
    mut rx: mpsc::UnboundedReceiver<String>,
) {
    while let Some(mut line) = rx.recv().await {
        line.push('\n');
        if stdin.write_all(line.as_bytes()).await.is_err() || stdin.flush().await.is_err() {
            break;
        }
    }
    // Dropping stdin closes it: the agent stops its jobs and exits.
}

pub(super) async fn read_stderr(
    host: String,
    stderr: tokio::process::ChildStderr,
    st: Arc<Mutex<Stderr>>,
) {
    let mut r = BufReader::new(stderr);
    while let Ok(Some(line)) = read_line(&mut r, 64 * 1024).await {
        let mut s = lock(&st);
        if s.echo {
            crate::errln!("[{host}] {line}");
        }
        s.tail.push_str(&line);
        s.tail.push('\n');
        if s.tail.len() > STDERR_KEEP {
            let mut cut = s.tail.len() - STDERR_KEEP;
            while !s.tail.is_char_boundary(cut) {
                cut += 1;
            }
            s.tail.drain(..cut);
        }
    }
}

/// Dispatches replies to their callers and prints job output with the host's name; when
/// the agent's stdout ends, every call still waiting fails with what ssh (or srun) said.
async fn read_replies(
    host: String,
    program: &'static str,
    mut stdout: BufReader<tokio::process::ChildStdout>,
    pending: Pending,
    partial: Arc<Mutex<Partial>>,
    dead: Arc<Mutex<Option<String>>>,
    err: Arc<Mutex<Stderr>>,
) {
    let why = loop {
        let line = match read_line(&mut stdout, protocol::MAX_REPLY).await {
            Ok(Some(l)) => l,
            Ok(None) => break "the agent's output ended".to_string(),
            Err(e) => break format!("reading from the agent: {e}"),
        };
        // A result reply as the agent writes it goes to its caller whole, unread here.
        if let Some(id) = protocol::ok_reply_id(&line) {
            deliver(&host, &partial, &pending, id, Ok(Answered::Line(line)));
            continue;
        }
        let (id, body) = match Message::read(&line) {
            Ok(Message::Reply { id, body }) => (id, body),
            Ok(Message::Output { id, stream, data }) => {
                let out = stream == Stream::Stdout;
                let mut p = lock(&partial);
                let buf = p.lines.entry((id, out)).or_default();
                buf.push_str(&data);
                print_lines(&host, out, buf, false);
                continue;
            }
            Ok(Message::Hello(_)) => continue,
            Err(e) => {
                tracing::warn!(
                    "host {host}: unreadable line from the agent ({e}): {}",
                    truncate(&line, 200)
                );
                continue;
            }
        };
        let body = match body {
            Body::Ok(v) => Ok(Answered::Raw(v)),
            Body::Error(e) => Err(e),
        };
        let Some(id) = id else {
            tracing::warn!("host {host}: the agent rejected a request: {body:?}");
            continue;
        };
        deliver(&host, &partial, &pending, id, body);
    };
    // Give ssh a moment to print why it ended.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let why = format!("{why}{}", quote(program, &lock(&err).tail));
    *lock(&dead) = Some(why);
    let mut p = lock(&partial);
    let ids: Vec<u64> = p.lines.keys().map(|(id, _)| *id).collect();
    for id in ids {
        p.flush(&host, id);
    }
    drop(p);
    // Dropping the senders wakes every waiting call.
    lock(&pending).clear();
}

/// Hands request `id`'s reply to its caller, after the rest of its output (a run's output
/// ends with its reply; a spawned job's goes on).
fn deliver(host: &str, partial: &Mutex<Partial>, pending: &Pending, id: u64, body: Answer) {
    {
        let mut p = lock(partial);
        if !p.spawned.contains(&id) {
            p.flush(host, id);
        }
    }
    if let Some(tx) = lock(pending).remove(&id) {
        let _ = tx.send(body);
    }
}

/// Prints the complete lines of `buf` as `[host] line` (all of it with `flush`).
fn print_lines(host: &str, stdout: bool, buf: &mut String, flush: bool) {
    let end = if flush {
        buf.len()
    } else {
        match buf.rfind('\n') {
            Some(i) => i + 1,
            None => return,
        }
    };
    if end == 0 {
        return;
    }
    let text: String = buf.drain(..end).collect();
    let mut s = String::new();
    for l in text.lines() {
        s.push_str(&format!("[{host}] {l}\n"));
    }
    if stdout {
        crate::output::bytes(s.as_bytes());
    } else {
        let _ = std::io::stderr().lock().write_all(s.as_bytes());
    }
}
