//! The client side: one long-lived agent per host, opened in parallel (at most `fanout`
//! at a time), calls with ids and deadlines over its stdio, behind a blocking API.

use super::protocol::{self, Answered, Body, Call, Hello, Message, Request, Stream, WireError};
use super::{push, HostError, HostsConfig, Transport, LOCAL};
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::io::Write;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot, Semaphore};

/// How much of what ssh (or the agent) printed on stderr is kept for error messages.
const STDERR_KEEP: usize = 4096;
/// How often a waiting call looks at the Ctrl-C flag.
const TICK: Duration = Duration::from_millis(50);
/// How long the session's end waits for agents to stop their jobs and exit.
const CLOSE_WAIT: Duration = Duration::from_secs(20);
/// How often a call still waiting pings its host (a ping unanswered for the host timeout
/// means the host hangs, however long the call itself may take).
const PROBE_EVERY: Duration = Duration::from_secs(5);

/// What a call waits for: its result, or the agent's error.
type Answer = Result<Answered, WireError>;

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Answer>>>>;

/// Job output not yet printed: the partial last line of each (request id, stdout?), and
/// the spawned jobs, whose output outlives their spawn's reply.
#[derive(Default)]
struct Partial {
    lines: HashMap<(u64, bool), String>,
    spawned: std::collections::HashSet<u64>,
}

impl Partial {
    /// Prints what is left of request `id`'s output.
    fn flush(&mut self, host: &str, id: u64) {
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
struct Stderr {
    tail: String,
    echo: bool,
}

/// One open agent.
pub(crate) struct Conn {
    host: String,
    pub hello: Hello,
    next_id: AtomicU64,
    writer: Mutex<Option<mpsc::UnboundedSender<String>>>,
    pending: Pending,
    partial: Arc<Mutex<Partial>>,
    /// Why the connection ended, once it has.
    dead: Arc<Mutex<Option<String>>>,
    /// How long the host may take to answer (a ping, or a call beyond its own time).
    answer_within: Duration,
    /// A call timed out: the host hangs. Later calls fail at once, and the session's end
    /// does not wait for this agent.
    hung: AtomicBool,
    child: Mutex<Option<tokio::process::Child>>,
    /// The transport is one of gpuloop's own helpers under this identity: the runner never
    /// takes it for a local job's orphan.
    helper: Option<crate::process::Identity>,
    /// The runtime (of `Pool::shards`) its reader, writer and calls run on.
    shard: usize,
}

enum Slot {
    Local,
    Remote(Result<Arc<Conn>, HostError>),
}

/// On a terminal, while a one-shot's hosts are still coming: `12/64 hosts answered` on one
/// line of stderr, rewritten as each answers, and each host said at once above it as it
/// comes in (its failure, or the line the command makes of its answer).
struct Progress {
    /// `--skip-unreachable`: an unreachable host is a warning.
    skip: bool,
    state: Mutex<Phase>,
    /// The hosts whose failure was said already (the command does not say it again).
    said: Mutex<std::collections::HashSet<String>>,
    /// What the command says of one host's answer (see `Pool::say_each`).
    line: Mutex<Option<LineOf>>,
}

/// A host's one line made from its answer (`None`: nothing to say of it); the answer is of
/// the type the command asked for, or of another call's, of which it says nothing.
type LineOf = Arc<dyn Fn(&str, &dyn std::any::Any) -> Option<String> + Send + Sync>;

/// One round of a progress line: what the hosts do ("connected", "answered"), and those
/// still to come, in host-set order.
#[derive(Default)]
struct Phase {
    what: &'static str,
    total: usize,
    /// The hosts still to come, by their place in the round (the line names the last few in
    /// order); a host that comes in is taken out by its place, never by a search (which made
    /// a round over 65,536 hosts quadratic).
    waiting: std::collections::BTreeMap<usize, String>,
    place: HashMap<String, Vec<usize>>,
    /// When the line was last drawn.
    drawn: Option<Instant>,
}

/// The line is drawn at most this often while many hosts are still to come (65,536 hosts
/// interrupted at once drew it 65,536 times).
const REDRAW: Duration = Duration::from_millis(50);

/// The line names the hosts still to come once they are this few.
const NAME_LAST: usize = 8;

impl Progress {
    fn start(&self, hosts: Vec<String>, what: &'static str) {
        let mut st = lock(&self.state);
        let mut place: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, h) in hosts.iter().enumerate() {
            place.entry(h.clone()).or_default().push(i);
        }
        *st = Phase {
            what,
            total: hosts.len(),
            place,
            waiting: hosts.into_iter().enumerate().collect(),
            drawn: None,
        };
        self.draw(&mut st, true);
    }

    /// Draws the line (`now`: even if it was drawn a moment ago: a line said above wiped it).
    fn draw(&self, st: &mut Phase, now: bool) {
        let few = st.waiting.len() <= NAME_LAST;
        if !now && !few && st.drawn.is_some_and(|t| t.elapsed() < REDRAW) {
            return;
        }
        st.drawn = Some(Instant::now());
        let done = st.total - st.waiting.len();
        let mut line = format!("{done}/{} hosts {}", st.total, st.what);
        if !st.waiting.is_empty() && st.waiting.len() <= NAME_LAST.min(st.total - 1) {
            let names: Vec<&String> = st.waiting.values().collect();
            line.push_str(&format!("; waiting for {}", super::fold::compress(&names)));
        }
        crate::err!("\r\x1b[K{line}");
    }

    /// What the command says of `host`'s answer, if anything.
    fn line_of(&self, host: &str, answer: &dyn std::any::Any) -> Option<String> {
        let line = lock(&self.line).clone()?;
        line(host, answer)
    }

    /// One host is in (`failed`: and this is why; `said`: the line made of its answer;
    /// either said now).
    fn tick(&self, host: &str, failed: Option<&HostError>, said: Option<String>) {
        let mut st = lock(&self.state);
        if let Some(i) = st.place.get_mut(host).and_then(Vec::pop) {
            st.waiting.remove(&i);
        }
        let wiped = said.is_some();
        if let Some(line) = said {
            crate::err!("\r\x1b[K{line}\n");
        }
        // An interrupt ends the run: nothing is said for each host it stopped.
        let failed = failed.filter(|e| !matches!(e, HostError::Interrupted));
        let wiped = match failed {
            Some(e) if lock(&self.said).insert(host.to_string()) => {
                let how = match self.skip && e.unreachable() {
                    true => "warning: skipping",
                    false => "gpuloop:",
                };
                crate::err!("\r\x1b[K{how} {e}\n");
                true
            }
            _ => wiped,
        };
        self.draw(&mut st, wiped);
    }

    fn clear(&self) {
        let _st = lock(&self.state);
        crate::err!("\r\x1b[K");
    }
}

/// The open connections of one session, in host-set order.
pub struct Pool {
    /// Runtimes of one thread each; every host's connection lives on one of them, the hosts
    /// spread evenly. A call's steps for one host (its request written, its reply read,
    /// parsed and made into records) then stay on one thread, and the hosts' steps run in
    /// parallel on the others.
    shards: Vec<tokio::runtime::Runtime>,
    slots: Vec<(String, Slot)>,
    /// Each host's place in `slots`: a call over the whole set finds every host's
    /// connection in constant time (a search of `slots` per host made a call over 65,536
    /// hosts quadratic: 42 s to end after a Ctrl-C).
    index: HashMap<String, usize>,
    pub config: HostsConfig,
    /// Seconds each connection took to say hello (for -v and the benchmark).
    pub connect_ms: Vec<(String, f64)>,
    progress: Option<Arc<Progress>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pool {
    /// Opens every remote host in parallel, `fanout` at a time; a host that fails keeps
    /// its error (each call to it returns that error). An interrupt ends the opening at
    /// once: the hosts not yet open keep `HostError::Interrupted`, and each ssh (or srun)
    /// started for them is killed and reaped.
    pub fn connect(config: HostsConfig, interrupted: &'static AtomicBool) -> Pool {
        let remote: Vec<String> = config
            .hosts
            .iter()
            .filter(|h| h.as_str() != LOCAL)
            .cloned()
            .collect();
        let shards: Vec<_> = (0..crate::process::cores()
            .clamp(2, 16)
            .min(remote.len().max(1)))
            .map(|_| {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("gpuloop-hosts")
                    .enable_all()
                    .build()
                    .expect("a tokio runtime starts (a thread and an epoll fd)")
            })
            .collect();
        // Closed on an interrupt: every host's opening waits on it beside its own work, so
        // one watcher wakes them all (thousands of hosts each polling the flag would not).
        let stop = Arc::new(Semaphore::new(0));
        if interrupted.load(Ordering::Relaxed) {
            // Interrupted already: no host is opened at all.
            stop.close();
        }
        let progress = (config.progress && remote.len() > 1).then(|| {
            Arc::new(Progress {
                skip: config.skip_unreachable,
                state: Mutex::default(),
                said: Mutex::default(),
                line: Mutex::default(),
            })
        });
        if let Some(p) = &progress {
            p.start(remote.clone(), "connected");
        }
        // One worker per place of the fan-out, each opening the next host not yet taken,
        // spread over the runtimes: the opening is `fanout` tasks whatever the host count
        // (a task per host cost 0.6 s to set up at 65,536 hosts, and an interrupt waited
        // for it), and an interrupt stops every worker before its next host.
        let remote = Arc::new(remote);
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let begun = Instant::now();
        let handles: Vec<_> = (0..config.fanout.max(1).min(remote.len()))
            .map(|w| {
                let shard = w % shards.len();
                let (hosts, next, transport) =
                    (remote.clone(), next.clone(), config.transport.clone());
                let (timeout, answer_within) = (config.connect_timeout, config.call_timeout);
                let (progress, stop) = (progress.clone(), stop.clone());
                shards[shard].spawn(async move {
                    let mut done = Vec::new();
                    while !stop.is_closed() {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(host) = hosts.get(i) else { break };
                        let r =
                            connect(host, &transport, timeout, answer_within, shard, &stop).await;
                        if let Some(p) = &progress {
                            p.tick(host, r.as_ref().err(), None);
                        }
                        done.push((i, r, begun.elapsed().as_secs_f64() * 1e3));
                    }
                    done
                })
            })
            .collect();
        let mut opened: Vec<Option<Result<Arc<Conn>, HostError>>> =
            remote.iter().map(|_| None).collect();
        let mut connect_ms = Vec::new();
        let watched = stop.clone();
        shards[0].block_on(async {
            let watch = tokio::spawn(async move {
                while !interrupted.load(Ordering::Relaxed) {
                    tokio::time::sleep(TICK).await;
                }
                watched.close();
            });
            for h in handles {
                for (i, r, ms) in h.await.unwrap_or_default() {
                    let host = &remote[i];
                    tracing::debug!(
                        "host {host}: connected in {ms:.1} ms: {:?}",
                        r.as_ref().map(|c| &c.hello)
                    );
                    connect_ms.push((host.clone(), ms));
                    opened[i] = Some(r.map(Arc::new));
                }
            }
            watch.abort();
        });
        // A host no worker took was left for the interrupt.
        let interrupted_before = stop.is_closed();
        let mut opened = opened.into_iter();
        let slots = config
            .hosts
            .iter()
            .map(|h| {
                let slot = if h == LOCAL {
                    Slot::Local
                } else {
                    Slot::Remote(opened.next().flatten().unwrap_or_else(|| {
                        Err(match interrupted_before {
                            true => HostError::Interrupted,
                            false => HostError::Connect {
                                host: h.clone(),
                                why: "the connection task failed".into(),
                            },
                        })
                    }))
                };
                (h.clone(), slot)
            })
            .collect::<Vec<_>>();
        let index = slots
            .iter()
            .enumerate()
            .map(|(i, (h, _))| (h.clone(), i))
            .collect();
        if let Some(p) = &progress {
            p.clear();
        }
        Pool {
            shards,
            slots,
            index,
            config,
            connect_ms,
            progress,
        }
    }

    /// On a terminal, each host's answer of type `U` (as a call's `then` made it) is said as
    /// it arrives, above the progress line, as `line` puts it; answers of other types are
    /// not. Without a terminal this does nothing.
    pub fn say_each<U: 'static>(
        &self,
        line: impl Fn(&str, &U) -> Option<String> + Send + Sync + 'static,
    ) {
        if let Some(p) = &self.progress {
            *lock(&p.line) = Some(Arc::new(move |host, answer| {
                line(host, answer.downcast_ref::<U>()?)
            }));
        }
    }

    /// Whether `host`'s failure was said already, as it happened (on a terminal).
    pub fn said(&self, host: &str) -> bool {
        self.progress
            .as_ref()
            .is_some_and(|p| lock(&p.said).contains(host))
    }

    pub fn hosts(&self) -> impl Iterator<Item = &str> {
        self.slots.iter().map(|(h, _)| h.as_str())
    }

    pub fn is_local(&self, host: &str) -> bool {
        host == LOCAL
    }

    /// The agent's hello, or why the host cannot be used.
    pub fn hello(&self, host: &str) -> Result<Option<&Hello>, HostError> {
        match self.slot(host)? {
            Slot::Local => Ok(None),
            Slot::Remote(Ok(c)) => Ok(Some(&c.hello)),
            Slot::Remote(Err(e)) => Err(e.clone()),
        }
    }

    fn slot(&self, host: &str) -> Result<&Slot, HostError> {
        self.index
            .get(host)
            .map(|&i| &self.slots[i].1)
            .ok_or_else(|| HostError::Unknown {
                host: host.to_string(),
                known: super::fold::set_of(&self.hosts().collect::<Vec<_>>()),
            })
    }

    /// Runs calls on several remote hosts at once; results in the order given. Each has
    /// `deadline` (None: none, the call ends when the host answers or the link drops).
    /// Each host's answer is parsed into `T` by its own task, so the hosts' replies are read
    /// in parallel and the caller only merges them (`Raw` keeps the JSON text).
    pub fn call_many<T: DeserializeOwned + Send + 'static>(
        &self,
        calls: Vec<(String, Call)>,
        deadline: Option<Duration>,
        interrupted: &'static AtomicBool,
    ) -> Vec<Result<T, HostError>> {
        self.call_many_then(calls, deadline, interrupted, |_, t| t)
    }

    /// `call_many`, with `then` applied to each host's answer (and its name) on that host's
    /// task too: the caller's own per-record work then runs in parallel with the other
    /// hosts' replies, not one host after another once all are in.
    pub fn call_many_then<T, U, F>(
        &self,
        calls: Vec<(String, Call)>,
        deadline: Option<Duration>,
        interrupted: &'static AtomicBool,
        then: F,
    ) -> Vec<Result<U, HostError>>
    where
        T: DeserializeOwned + Send + 'static,
        U: Send + 'static,
        F: Fn(&str, T) -> U + Send + Sync + 'static,
    {
        let then = Arc::new(then);
        let mut work = Vec::new();
        let mut out: Vec<Option<Result<U, HostError>>> = Vec::new();
        let mut names = Vec::new();
        for (i, (host, call)) in calls.into_iter().enumerate() {
            out.push(None);
            names.push(host.clone());
            match self.slot(&host) {
                Ok(Slot::Remote(Ok(c))) => work.push((i, c.clone(), call)),
                Ok(Slot::Remote(Err(e))) => out[i] = Some(Err(e.clone())),
                Ok(Slot::Local) => {
                    out[i] = Some(Err(HostError::Unknown {
                        host,
                        known: "remote hosts".into(),
                    }))
                }
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        let started = Instant::now();
        let progress = self.progress.clone().filter(|_| work.len() > 1);
        if let Some(p) = &progress {
            p.start(work.iter().map(|w| w.1.host.clone()).collect(), "answered");
        }
        // Each host's task goes to its connection's runtime.
        let handles: Vec<_> = work
            .into_iter()
            .map(|(i, c, call)| {
                let then = then.clone();
                let progress = progress.clone();
                let task = self.shards[c.shard].spawn(async move {
                    let r = async {
                        let raw = c.call(call, deadline, interrupted).await?;
                        let answered = started.elapsed();
                        let t = raw.parse::<T>().map_err(|e| HostError::Protocol {
                            host: c.host.clone(),
                            why: format!("unexpected reply: {e}"),
                        })?;
                        Ok((then(&c.host, t), answered, started.elapsed()))
                    }
                    .await;
                    if let Some(p) = &progress {
                        let said = r.as_ref().ok().and_then(|(u, ..)| p.line_of(&c.host, u));
                        p.tick(&c.host, r.as_ref().err(), said);
                    }
                    r
                });
                (i, task)
            })
            .collect();
        let (answers, joined) = self.shards[0].block_on(async {
            let mut answers = Vec::new();
            for (i, task) in handles {
                answers.push((i, task.await));
            }
            (answers, started.elapsed())
        });
        if let Some(p) = &progress {
            p.clear();
        }
        // A host's task that panicked is that host's error.
        let task_failed = |host: &str, why: String| HostError::Protocol {
            host: host.to_string(),
            why: format!("the call task failed: {why}"),
        };
        let mut times = Vec::new();
        for (i, r) in answers {
            out[i] = Some(match r {
                Ok(r) => r.map(|(u, answered, done)| {
                    times.push((answered, done, i));
                    u
                }),
                Err(e) => Err(task_failed(&names[i], e.to_string())),
            });
        }
        if tracing::enabled!(tracing::Level::DEBUG) && !times.is_empty() {
            log_times(&times, &names, joined, started.elapsed());
        }
        out.into_iter()
            .zip(&names)
            .map(|(r, host)| r.unwrap_or_else(|| Err(task_failed(host, "no answer".into()))))
            .collect()
    }

    /// Prints the rest of a spawned job's output (its last line, if it had no newline),
    /// once its outcome is in.
    pub fn flush_output(&self, host: &str, job: u64) {
        if let Ok(Slot::Remote(Ok(c))) = self.slot(host) {
            let mut p = lock(&c.partial);
            p.spawned.remove(&job);
            p.flush(host, job);
        }
    }

    /// One call on one remote host.
    pub fn call<T: DeserializeOwned + Send + 'static>(
        &self,
        host: &str,
        call: Call,
        deadline: Option<Duration>,
        interrupted: &'static AtomicBool,
    ) -> Result<T, HostError> {
        self.call_many(vec![(host.to_string(), call)], deadline, interrupted)
            .pop()
            .unwrap_or(Err(HostError::Interrupted))
    }
}

impl Drop for Pool {
    /// Closes every agent's stdin (it then stops its jobs and exits) and waits, bounded,
    /// for them to be gone, so nothing started there outlives this session.
    fn drop(&mut self) {
        let mut children: Vec<Vec<_>> = self.shards.iter().map(|_| Vec::new()).collect();
        for (_, slot) in &self.slots {
            if let Slot::Remote(Ok(c)) = slot {
                lock(&c.writer).take();
                if let Some(mut child) = lock(&c.child).take() {
                    if c.hung.load(Ordering::Relaxed) {
                        // It would not answer; dropping the link is all that is left (its
                        // agent stops its jobs when it reads again and finds the end).
                        let _ = child.start_kill();
                    }
                    children[c.shard].push((child, c.helper));
                }
            }
        }
        // Each runtime waits for its own children (their exits are noticed by its driver),
        // all at once, under one deadline.
        let deadline = Instant::now() + CLOSE_WAIT;
        let waits: Vec<_> = self
            .shards
            .iter()
            .zip(children)
            .map(|(rt, children)| {
                rt.spawn(async move {
                    let deadline = tokio::time::Instant::from_std(deadline);
                    for (mut c, helper) in children {
                        match tokio::time::timeout_at(deadline, c.wait()).await {
                            // Reaped: its identity names nothing any more.
                            Ok(_) => crate::process::helpers::forget(helper),
                            Err(_) => {
                                let _ = c.start_kill();
                            }
                        }
                    }
                })
            })
            .collect();
        if let Some(rt) = self.shards.first() {
            rt.block_on(async {
                for w in waits {
                    let _ = w.await;
                }
            });
        }
    }
}

impl Conn {
    async fn call(
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

/// `-v`: where one call over several hosts spent its time, and which host answered last
/// (each host's answer as its task saw it, since the call began).
fn log_times(
    times: &[(Duration, Duration, usize)],
    names: &[String],
    joined: Duration,
    all: Duration,
) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let first = times.iter().map(|t| t.0).min().unwrap_or_default();
    let last = times.iter().max_by_key(|t| t.0).copied();
    let done = times.iter().map(|t| t.1).max().unwrap_or_default();
    if let Some((answered, _, i)) = last {
        tracing::debug!(
            "{} hosts answered in {:.3} ms to {:.3} ms (last: {}); their records were ready at {:.3} ms, collected at {:.3} ms, returned at {:.3} ms",
            times.len(),
            ms(first),
            ms(answered),
            names[i],
            ms(done),
            ms(joined),
            ms(all)
        );
    }
}

/// Cancel requests and pings get ids of their own, apart from the calls' ids.
const CANCEL_BIT: u64 = 1 << 62;
const PING_BIT: u64 = 1 << 61;
/// `reached_as`'s id: its answer is not awaited.
const REACHED_ID: u64 = 1 << 60;

/// Marks the version error that sends this gpuloop instead of the host's own.
const PUSH_INSTEAD: &str = "(push)";

/// Starts the agent and reads its hello; where the host's own gpuloop speaks another
/// protocol and gpuloop is pushed, again with this one's copy.
async fn connect(
    host: &str,
    transport: &Transport,
    timeout: Duration,
    answer_within: Duration,
    shard: usize,
    stop: &Semaphore,
) -> Result<Conn, HostError> {
    let started = Instant::now();
    match connect_once(host, transport, timeout, answer_within, shard, false, stop).await {
        Err(HostError::Version { ours, .. }) if ours == PUSH_INSTEAD => {
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
    // A connection is kept between runs only where the user's ssh config keeps none itself
    // (its own ControlPath wins); ssh -G says, without connecting. A socket already there
    // is one an earlier run decided on: used without asking again (a ControlPath added to
    // the config since then wins once that master has gone, ControlPersist after its use).
    let mux = match (transport.kept_socket(host), transport.show_config(host)) {
        (Some(sock), _) if sock.exists() => true,
        (_, Some(g)) => tokio::select! {
            // The interrupt first: polled first, `ssh -G` would be started only to be killed.
            biased;
            _ = stopped(stop) => return Err(HostError::Interrupted),
            // Dropped, `ssh -G` is killed (and reaped by tokio).
            shown = output_of(&g, timeout) => {
                shown.is_some_and(|shown| !super::transport::sets_control_path(&shown))
            }
        },
        _ => false,
    };
    let timeout = timeout.saturating_sub(started.elapsed());
    if stop.is_closed() {
        return Err(HostError::Interrupted);
    }
    let launch = transport.launch(host, mux, skip_path)?;
    tracing::debug!("host {host}: {} {}", launch.program, launch.args.join(" "));
    let program = transport.program();
    let mut cmd = tokio::process::Command::new(&launch.program);
    for v in &launch.env_remove {
        cmd.env_remove(v);
    }
    cmd.args(&launch.args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        // A Ctrl-C at the terminal is gpuloop's to handle; it must not cut every link.
        .process_group(0);
    // A child in a group of its own: registered as gpuloop's own before anything can see it,
    // or the runner would stop it as a local job's orphan.
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
    let mut stdout = BufReader::new(stdout);

    let mut stdin = stdin;
    // The first line is the agent's hello; where gpuloop is pushed, the push script's
    // questions may come first (`push`), all within the one timeout.
    let hello = tokio::time::timeout(timeout, async {
        loop {
            let line = read_line(&mut stdout, 64 * 1024).await;
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
    });
    let first = tokio::select! {
        biased;
        _ = stopped(stop) => {
            // Killed and reaped here: nothing this run started outlives it.
            let _ = child.start_kill();
            let _ = tokio::time::timeout(CLOSE_WAIT, child.wait()).await;
            crate::process::helpers::forget(helper);
            return Err(HostError::Interrupted);
        }
        first = hello => first,
    };
    let first = match first {
        Ok(Err(e)) => {
            let _ = child.start_kill();
            return Err(e);
        }
        Ok(Ok(line)) => Ok(line),
        Err(e) => Err(e),
    };
    let said = |st: &Arc<Mutex<Stderr>>| lock(st).tail.clone();
    let hello = match first {
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
                    quote(program, &said(&err_state))
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
                        quote(program, &said(&err_state))
                    ),
                });
            }
            return Err(transport.classify(host, code, &said(&err_state)));
        }
    };
    if hello.protocol != protocol::PROTOCOL && transport.pushes() && !skip_path {
        // Its own gpuloop speaks another protocol: this one's copy will do.
        let _ = child.start_kill();
        return Err(HostError::Version {
            host: host.to_string(),
            theirs: hello.version,
            their_protocol: hello.protocol,
            ours: PUSH_INSTEAD.into(),
            our_protocol: protocol::PROTOCOL,
        });
    }
    if hello.protocol != protocol::PROTOCOL {
        let _ = child.start_kill();
        return Err(HostError::Version {
            host: host.to_string(),
            theirs: hello.version,
            their_protocol: hello.protocol,
            ours: env!("CARGO_PKG_VERSION").into(),
            our_protocol: protocol::PROTOCOL,
        });
    }
    lock(&err_state).echo = true;

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
        program,
        stdout,
        pending.clone(),
        partial.clone(),
        dead.clone(),
        err_state,
    ));
    Ok(Conn {
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
    })
}

/// Returns once the opening of the hosts is to stop (`stop` closed on an interrupt).
async fn stopped(stop: &Semaphore) {
    // No permit is ever added: the wait ends only when the semaphore is closed.
    let _ = stop.acquire().await;
}

/// A short command's stdout, or `None` if it failed or outlived `within` (then it is killed).
async fn output_of(l: &super::transport::Launch, within: Duration) -> Option<String> {
    let mut cmd = tokio::process::Command::new(&l.program);
    cmd.args(&l.args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .process_group(0);
    let (child, helper) = crate::process::helpers::start(|| cmd.spawn(), |c| c.id()).ok()?;
    let out = tokio::time::timeout(within, child.wait_with_output()).await;
    // Reaped by wait_with_output, or killed and reaped on drop by tokio.
    crate::process::helpers::forget(helper);
    match out {
        Ok(Ok(o)) if o.status.success() => Some(String::from_utf8_lossy(&o.stdout).into_owned()),
        _ => None,
    }
}

/// `; ssh said: LAST LINE` (or srun), or nothing when it said nothing.
fn quote(program: &str, said: &str) -> String {
    let s = said.trim();
    match s.lines().last() {
        Some(last) if !s.is_empty() => format!("; {program} said: {last}"),
        _ => String::new(),
    }
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// One line, without its newline; `Ok(None)` at EOF. A line longer than `max` is an error.
async fn read_line<R: AsyncRead + Unpin>(
    r: &mut BufReader<R>,
    max: usize,
) -> std::io::Result<Option<String>> {
    let mut buf = Vec::new();
    let n = (&mut *r)
        .take(max as u64 + 1)
        .read_until(b'\n', &mut buf)
        .await?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') && buf.len() > max {
        return Err(std::io::Error::other(format!(
            "a line longer than {max} bytes"
        )));
    }
    while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
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

async fn read_stderr(host: String, stderr: tokio::process::ChildStderr, st: Arc<Mutex<Stderr>>) {
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
        let mut o = std::io::stdout().lock();
        let _ = o.write_all(s.as_bytes());
        let _ = o.flush();
    } else {
        let _ = std::io::stderr().lock().write_all(s.as_bytes());
    }
}
