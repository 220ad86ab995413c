//! The open connections of one session, in host-set order, behind a blocking API: the
//! hosts opened in parallel, calls fanned out to their agents and the answers gathered.

use super::conn::Conn;
use super::handshake::connect;
use super::progress::Progress;
use super::{lock, CLOSE_WAIT, TICK};
use crate::hosts::protocol::{Call, Hello};
use crate::hosts::{HostError, HostsConfig, LOCAL};
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// A host of the set: this machine, or an agent opened (or why it could not be).
enum Slot {
    Local,
    Remote(Result<Arc<Conn>, HostError>),
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
        let progress = (config.progress && remote.len() > 1)
            .then(|| Arc::new(Progress::new(config.skip_unreachable)));
        if let Some(p) = &progress {
            p.start(remote.clone(), "connected");
        }
        // One worker per place of the fan-out, each opening the next host not yet taken,
        // spread over the runtimes: the opening is `fanout` tasks whatever the host count
        // (a task per host cost 0.6 s to set up at 65,536 hosts, and an interrupt waited
        // for it), and an interrupt stops every worker before its next host.
        let remote = Arc::new(remote);
        let next = Arc::new(AtomicUsize::new(0));
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
                known: crate::hosts::fold::set_of(&self.hosts().collect::<Vec<_>>()),
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
