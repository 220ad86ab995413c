//! `gpuloop mcp`: a Model Context Protocol server over stdio (the official `rmcp` SDK on
//! tokio), so an AI assistant runs the act-verify loop through gpuloop's tools.
//!
//! `tools` carries each call out through `machine`, exactly as the CLI does; `policy` is
//! what the person allowed (read-only by default); the audit journal (`crate::journal`)
//! records every call and every signal a call sends. The async
//! side here only moves messages: each call runs on a blocking thread with its own stop flag,
//! set when the client cancels it, so a cancelled call stops what it started.

pub(crate) mod policy;
mod stdio;
mod summary;
pub(crate) mod tools;

use crate::exit::Exit;
use crate::journal::{self, CallResult, FrontEnd};
use crate::session::Session;
use policy::Policy;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorCode,
    Implementation, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tools::{CallError, Ctx, Progress, Reply};

/// How long in-flight calls get to stop what they started when the server ends.
const DRAIN: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error)]
pub(crate) enum McpServeError {
    #[error("cannot start the MCP server's runtime: {0}")]
    Runtime(std::io::Error),
    #[error("MCP server: {0}")]
    Serve(String),
}

pub(crate) struct Server {
    session: Arc<Session>,
    policy: Arc<Policy>,
    journal: Option<PathBuf>,
    tools: Arc<Vec<Tool>>,
    /// Set when the server is ending: every call still running stops.
    ending: Arc<AtomicBool>,
    in_flight: Arc<AtomicUsize>,
}

impl Server {
    /// What the instructions add when the server was started with `--host`.
    fn over_hosts(&self) -> String {
        if self.session.is_local() {
            return String::new();
        }
        let hosts = self.session.host_names();
        format!(
            " This server reads several hosts ({}): gpus, holders and diagnose gather from \
             all of them, each record with its `host`; {} are refused here (they act on one \
             machine).",
            hosts.join(", "),
            tools::ONE_MACHINE.join(", ")
        )
    }

    pub(crate) fn new(session: Arc<Session>, policy: Policy, journal: Option<PathBuf>) -> Server {
        Server {
            session,
            tools: Arc::new(tools::list(&policy)),
            policy: Arc::new(policy),
            journal,
            ending: Arc::new(AtomicBool::new(false)),
            in_flight: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn record(&self, entry: journal::Call) {
        if let Some(p) = &self.journal {
            if let Err(e) = journal::call(p, entry) {
                tracing::warn!("{e}");
                crate::errln!("gpuloop mcp: warning: {e}");
            }
        }
    }
}

/// Counts a call's blocking work as in flight until it returns.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn enter(count: &Arc<AtomicUsize>) -> InFlight {
        count.fetch_add(1, Ordering::SeqCst);
        InFlight(count.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Sets a call's stop flag when its future is dropped (the service ended under it), so the
/// blocking work never outlives its caller unstopped.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        let mut me = Implementation::new("gpuloop", env!("CARGO_PKG_VERSION"));
        me.title = Some("gpuloop".into());
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(me)
            .with_instructions(format!(
                "gpuloop finds who holds each GPU, stops them safely, and verifies the memory \
                 is really released. Start with `diagnose` (or `gpus`, `holders`); `clean` stops \
                 the holders and verifies; `wait_clean` waits instead of sleeping. This server's \
                 policy, set by the person who runs it: {}. Protected GPU daemons are never \
                 signalled. Quote the one-line summary each tool returns. A call that is \
                 refused or cannot run comes back as an error result whose text says why and \
                 what to do; a refusal says how the person can allow it.{}",
                self.policy.describe(),
                self.over_hosts()
            ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.tools.as_ref().clone()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        let arguments = request.arguments.unwrap_or_default();
        let token = context.meta.get_progress_token();
        let stop = Arc::new(AtomicBool::new(false));
        let _stop_if_dropped = StopOnDrop(stop.clone());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Progress>();
        let started = Instant::now();
        let mut task = {
            let (session, policy, stop) = (self.session.clone(), self.policy.clone(), stop.clone());
            let (name, arguments) = (name.clone(), arguments.clone());
            let counted = InFlight::enter(&self.in_flight);
            tokio::task::spawn_blocking(move || {
                let _counted = counted;
                let progress = move |p: Progress| {
                    let _ = tx.send(p);
                };
                // The signals this call sends are journaled with it.
                let call = serde_json::json!({ "tool": name, "arguments": arguments.clone() });
                let ctx = Ctx {
                    session: &session,
                    policy: &policy,
                    stop: &stop,
                    progress: &progress,
                    served: journal::Served::new(FrontEnd::Mcp, call),
                };
                tools::call(&ctx, &name, arguments)
            })
        };
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let joined = loop {
            tokio::select! {
                r = &mut task => break r,
                Some(p) = rx.recv() => {
                    if let Some(token) = &token {
                        let mut n = ProgressNotificationParam::new(token.clone(), p.done)
                            .with_message(p.message);
                        if let Some(total) = p.total.filter(|&t| t >= p.done) {
                            n = n.with_total(total);
                        }
                        let _ = context.peer.notify_progress(n).await;
                    }
                }
                _ = tick.tick() => {
                    if context.ct.is_cancelled()
                        || self.ending.load(Ordering::Relaxed)
                        || crate::interrupt::is_set()
                    {
                        stop.store(true, Ordering::SeqCst);
                    }
                }
            }
        };
        // What the model must read (bad arguments, a refusal, a failure) is a tool result
        // with `isError`: many clients show a model only tool results, never protocol
        // errors. An unknown tool stays a protocol error, and a cancelled call gets no result.
        let (reply, result) = match joined {
            Ok(Ok(r)) => {
                let result = match r.failed {
                    true => CallResult::Error,
                    false => CallResult::Ok,
                };
                (Ok(r), result)
            }
            Ok(Err(CallError::Refused(r))) => (Ok(Reply::refused(&r)), CallResult::Refused),
            Ok(Err(e @ (CallError::BadArguments(_) | CallError::NotOverHosts { .. }))) => {
                (Ok(Reply::failed(e)), CallResult::Error)
            }
            Ok(Err(e @ CallError::UnknownTool(_))) => (Err(e), CallResult::Error),
            Ok(Err(e @ CallError::Cancelled { .. })) => (Err(e), CallResult::Cancelled),
            Err(e) => (
                Ok(Reply::failed(format!("{name}: internal error: {e}"))),
                CallResult::Error,
            ),
        };
        let (signalled, summary) = match &reply {
            Ok(r) => (r.signalled.clone(), r.summary.clone()),
            Err(CallError::Cancelled { signalled }) => (
                signalled.clone(),
                "cancelled by the client; what the call started was stopped".into(),
            ),
            Err(e) => (Vec::new(), e.to_string()),
        };
        self.record(journal::Call {
            tool: name.clone(),
            arguments: Value::Object(arguments),
            signalled,
            result,
            summary,
            elapsed_ms: started.elapsed().as_millis() as i64,
        });
        match reply {
            Ok(reply) => {
                // The line to quote first, then the record as JSON text for clients that
                // show models only text; the same record as structured content. Text blocks
                // are shown to people as they are: the JSON writes controls (in a name
                // another user chose) as `\u` escapes.
                let json_text = crate::shown::json(&reply.data, false).unwrap_or_default();
                let line = summary_text(&reply);
                let mut result = if reply.failed {
                    CallToolResult::structured_error(reply.data)
                } else {
                    CallToolResult::structured(reply.data)
                };
                result.content = vec![ContentBlock::text(line), ContentBlock::text(json_text)];
                Ok(result.into())
            }
            Err(e @ CallError::UnknownTool(_)) => {
                Err(McpError::invalid_params(e.to_string(), None))
            }
            Err(e) => Err(McpError::new(
                ErrorCode::INTERNAL_ERROR,
                e.to_string(),
                None,
            )),
        }
    }
}

/// Serves MCP on stdin/stdout until the client closes the connection or gpuloop is
/// interrupted; returns the exit code. Jobs started by `run` are stopped before it returns.
pub(crate) fn serve(session: Arc<Session>, policy: Policy) -> Result<Exit, McpServeError> {
    let journal = match journal::dir() {
        Ok(p) => Some(p),
        Err(e) => {
            crate::errln!("gpuloop mcp: warning: calls are not journaled: {e}");
            None
        }
    };
    tracing::debug!("mcp: policy {}, journal {journal:?}", policy.describe());
    // Whatever `run` starts is stopped when the server ends, however it ends.
    let _jobs = crate::runner::Supervisor::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(McpServeError::Runtime)?;
    let server = Server::new(session, policy, journal);
    let ending = server.ending.clone();
    let in_flight = server.in_flight.clone();
    let result = runtime.block_on(async move {
        let (input, output, written) = stdio::transport();
        let running = server
            .serve((input, output))
            .await
            .map_err(|e| McpServeError::Serve(e.to_string()))?;
        let cancel = running.cancellation_token();
        let watch = tokio::spawn(async move {
            while !crate::interrupt::is_set() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            cancel.cancel();
        });
        let quit = running.waiting().await;
        watch.abort();
        // Every reply rmcp wrote is on stdout before the server says it ended.
        let _ = tokio::time::timeout(Duration::from_secs(5), written).await;
        tracing::debug!("mcp: server ended: {quit:?}");
        Ok::<(), McpServeError>(())
    });
    // Stop the calls still running and give them time to stop what they started.
    ending.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + DRAIN;
    while in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    // A read of stdin may still be pending: do not wait for it.
    runtime.shutdown_background();
    result?;
    Ok(match crate::interrupt::is_set() {
        true => Exit::Interrupted,
        false => Exit::Success,
    })
}

/// The first text block of a result, shown to people as it is: a summary is one line, its
/// controls (a name another user chose) escaped, newlines too; an error keeps its lines (a
/// script's source line and caret), every other control escaped.
fn summary_text(reply: &Reply) -> String {
    match reply.failed {
        true => crate::shown::text(&reply.summary).into_owned(),
        false => crate::shown::shown(&reply.summary).to_string(),
    }
}
