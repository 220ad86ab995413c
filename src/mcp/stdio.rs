//! MCP's stdin and stdout, with one check before rmcp reads a line: a `tools/call` whose params
//! rmcp cannot read (a duplicate key, arguments that are no object) is answered here with
//! JSON-RPC's "invalid params" (-32602). rmcp would take it for an unknown method (-32601),
//! which tells the client nothing of what it got wrong.

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream};
use tokio::sync::mpsc;

/// JSON-RPC's code for a method's parameters that are not what it takes.
const INVALID_PARAMS: i64 = -32602;

/// How much of a message rmcp may be handed through the pipes at once.
const PIPE: usize = 1 << 20;

/// An object's entries as written, duplicates kept (serde_json's maps keep the last).
struct Entries(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Entries, D::Error> {
        struct Each;
        impl<'de> Visitor<'de> for Each {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Entries, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = m.next_entry::<String, Value>()? {
                    entries.push(entry);
                }
                Ok(Entries(entries))
            }
        }
        d.deserialize_map(Each)
    }
}

/// The kind of a JSON value, as a message says it.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// What is wrong with a `tools/call` request's params, if anything.
fn params_fault(params: Option<&serde_json::value::RawValue>) -> Option<String> {
    let Some(params) = params else {
        return Some("tools/call needs params: {name, arguments}".into());
    };
    let entries = match serde_json::from_str::<Entries>(params.get()) {
        Ok(Entries(e)) => e,
        Err(_) => {
            let v: Value = serde_json::from_str(params.get()).unwrap_or(Value::Null);
            return Some(format!("params must be an object, not {}", kind(&v)));
        }
    };
    for (i, (key, _)) in entries.iter().enumerate() {
        if entries[..i].iter().any(|(k, _)| k == key) {
            return Some(format!("params has the key {key:?} twice"));
        }
    }
    let get = |name: &str| entries.iter().find(|(k, _)| k == name).map(|(_, v)| v);
    match get("name") {
        Some(Value::String(_)) => {}
        Some(v) => return Some(format!("name must be a string, not {}", kind(v))),
        None => return Some("params has no name (the tool to call)".into()),
    }
    match get("arguments") {
        None | Some(Value::Null | Value::Object(_)) => None,
        Some(v) => Some(format!("arguments must be an object, not {}", kind(v))),
    }
}

/// The error reply for a line that is a `tools/call` request with params rmcp cannot read;
/// `None` for any other line, which rmcp reads as it is.
pub(crate) fn invalid_tools_call(line: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Message<'a> {
        #[serde(default)]
        id: Option<Value>,
        #[serde(default)]
        method: Option<String>,
        #[serde(borrow, default)]
        params: Option<&'a serde_json::value::RawValue>,
    }
    let m: Message = serde_json::from_str(line).ok()?;
    let id = m.id.filter(|id| id.is_string() || id.is_number())?;
    if m.method.as_deref() != Some("tools/call") {
        return None;
    }
    let why = params_fault(m.params)?;
    let reply = json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": INVALID_PARAMS, "message": format!("invalid params: {why}")},
    });
    Some(reply.to_string())
}

/// rmcp's side of stdin and stdout: lines from stdin pass to it unless `invalid_tools_call`
/// answers them; its lines and those answers go to stdout, a whole line at a time. The task
/// returned ends once rmcp's output has ended and all of it is written.
pub(crate) fn transport() -> (DuplexStream, DuplexStream, tokio::task::JoinHandle<()>) {
    let (rmcp_in, mut feed) = tokio::io::duplex(PIPE);
    let (rmcp_out, from_rmcp) = tokio::io::duplex(PIPE);
    let (answers, answered) = mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            match invalid_tools_call(&line) {
                Some(reply) => {
                    if answers.send(reply).is_err() {
                        break;
                    }
                }
                None => {
                    let whole = feed.write_all(line.as_bytes()).await;
                    if whole.and(feed.write_all(b"\n").await).is_err() {
                        break;
                    }
                }
            }
        }
        // End of stdin: rmcp reads the end of its input and ends the session.
        let _ = feed.shutdown().await;
    });
    let writer = tokio::spawn(forward(
        BufReader::new(from_rmcp),
        answered,
        tokio::io::stdout(),
    ));
    (rmcp_in, rmcp_out, writer)
}

/// Writes rmcp's lines and this side's answers to `out` as they come, until rmcp's output
/// ends (or `out` fails: the server then exits 1, unless it was a closed pipe); then the
/// answers still queued. rmcp's output ends only after stdin has ended, and by
/// then every answer to a line before the end is queued: none is lost to the race between
/// the two (`select!` takes either when both are ready).
async fn forward(
    from_rmcp: impl tokio::io::AsyncBufRead + Unpin,
    mut answered: mpsc::UnboundedReceiver<String>,
    mut out: impl tokio::io::AsyncWrite + Unpin,
) {
    let mut replies = from_rmcp.lines();
    loop {
        let line = tokio::select! {
            l = replies.next_line() => match l {
                Ok(Some(l)) => l,
                _ => break,
            },
            Some(l) = answered.recv() => l,
        };
        if let Err(e) = write_line(&mut out, &line).await {
            return crate::output::failed(&e);
        }
    }
    while let Ok(line) = answered.try_recv() {
        if let Err(e) = write_line(&mut out, &line).await {
            return crate::output::failed(&e);
        }
    }
}

async fn write_line(
    out: &mut (impl tokio::io::AsyncWrite + Unpin),
    line: &str,
) -> std::io::Result<()> {
    if let Some(e) = crate::output::unwritable() {
        return Err(e);
    }
    out.write_all(format!("{line}\n").as_bytes()).await?;
    out.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(line: &str) -> Option<(Value, String)> {
        let v: Value = serde_json::from_str(&invalid_tools_call(line)?).unwrap();
        assert_eq!(v["error"]["code"], INVALID_PARAMS);
        Some((
            v["id"].clone(),
            v["error"]["message"].as_str().unwrap().to_string(),
        ))
    }

    /// A passing run of the MCP tests lost, about one time in thirty, the answer to a
    /// malformed call sent just before stdin ended: rmcp's output ended while the answer was
    /// queued, and `select!` took the end first.
    #[test]
    fn answers_queued_when_rmcps_output_ends_are_still_written() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        for _ in 0..32 {
            let (tx, rx) = mpsc::unbounded_channel();
            for id in 1..=3 {
                tx.send(format!("answer {id}")).unwrap();
            }
            drop(tx);
            let mut out = Vec::new();
            rt.block_on(forward(&b"rmcp 1\n"[..], rx, &mut out));
            let mut lines: Vec<&str> = std::str::from_utf8(&out).unwrap().lines().collect();
            lines.sort();
            assert_eq!(lines, ["answer 1", "answer 2", "answer 3", "rmcp 1"]);
        }
    }

    #[test]
    fn malformed_tools_call_params_are_invalid_params() {
        let call = |params: &str| {
            format!(r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{params}}}"#)
        };
        for (params, want) in [
            (r#"{"name":"gpus","name":"kill"}"#, "key \"name\" twice"),
            (
                r#"{"name":"gpus","arguments":"x"}"#,
                "arguments must be an object, not a string",
            ),
            (r#"{"name":"gpus","arguments":[1]}"#, "not an array"),
            (r#"[1,2]"#, "params must be an object, not an array"),
            (r#"{"name":3}"#, "name must be a string"),
            (r#"{"arguments":{}}"#, "no name"),
        ] {
            let (id, message) = code(&call(params)).unwrap_or_else(|| panic!("{params}"));
            assert_eq!(id, json!(7));
            assert!(message.contains(want), "{params}: {message}");
        }
        for fine in [
            call(r#"{"name":"gpus"}"#),
            call(r#"{"name":"kill","arguments":{"pids":[1]}}"#),
            call(r#"{"name":"gpus","arguments":null}"#),
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.to_string(),
            r#"{"jsonrpc":"2.0","method":"tools/call","params":"x"}"#.to_string(),
            "not json".to_string(),
        ] {
            assert_eq!(invalid_tools_call(&fine), None, "{fine}");
        }
    }
}
