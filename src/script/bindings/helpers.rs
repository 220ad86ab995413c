//! The small helpers scripts share: time, logging, files, JSON, exit, and loops of closures.

use crate::config::Limits;
use crate::script::convert::{
    check_depth, check_spec, script_err, secs_arg, to_script, RhaiResult,
};
use crate::script::engine::def;
use crate::script::errors;
use crate::script::recipes::needs::{Act, Powers};
use rhai::{Dynamic, Engine, EvalAltResult, FnPtr, ImmutableString, NativeCallContext, Position};
use std::time::{Duration, Instant};

/// Calls a closure with the attempt number if it takes one, else with no arguments.
fn call(ctx: &NativeCallContext, f: &FnPtr, arg: i64) -> RhaiResult<Dynamic> {
    match f.call_within_context::<Dynamic>(ctx, (arg,)) {
        Err(e) if matches!(*e, EvalAltResult::ErrorFunctionNotFound(ref sig, _) if sig.starts_with(f.fn_name())) => {
            f.call_within_context::<Dynamic>(ctx, ())
        }
        r => r,
    }
}

/// `msg` on stderr after the seconds since `start`, when the engine was built. A message
/// quotes what other users chose (a holder's name): its controls are shown escaped.
fn log_line(start: Instant, msg: &Dynamic) {
    crate::errln!(
        "[{:>7.2}s] {}",
        start.elapsed().as_secs_f64(),
        crate::shown::text(&msg.to_string())
    );
}

/// rhai's functions that allocate as much as an argument asks, checked first against the
/// limits (rhai's own versions check its size limits, which gpuloop does not set: see
/// `engine::build_engine`). Without this, `blob(100000000000)` is one allocation that fails
/// and aborts before any step could see the memory limit.
fn register_sized(engine: &mut Engine, limits: &Limits) {
    // `limit`: the limit's name, for the message.
    let size = |what: &'static str,
                limit: &'static str,
                len: i64,
                max: usize|
     -> RhaiResult<usize> {
        match usize::try_from(len) {
            Ok(n) if n <= max => Ok(n),
            Ok(_) => Err(script_err(format!(
                "{what}: {len} is more than the {limit} limit of {max} (raise it with --limit {limit}=N or [limits] in config.toml)"
            ))),
            Err(_) => Ok(0),
        }
    };
    let max = limits.array;
    def(
        engine,
        "pad",
        &["array: &mut Array", "len: i64", "item: ?", "()"],
        "Pads the array to at least len elements with copies of item (at most the array limit).",
        move |a: &mut rhai::Array, len: i64, item: Dynamic| -> RhaiResult<()> {
            let n = size("pad", "array", len, max)?;
            if n > a.len() {
                a.resize(n, item);
            }
            Ok(())
        },
    );
    def(
        engine,
        "pad",
        &["blob: &mut Blob", "len: i64", "value: i64", "()"],
        "Pads the BLOB to at least len bytes with the byte value (at most the array limit).",
        move |b: &mut rhai::Blob, len: i64, value: i64| -> RhaiResult<()> {
            let n = size("pad", "array", len, max)?;
            if n > b.len() {
                b.resize(n, (value & 0xff) as u8);
            }
            Ok(())
        },
    );
    def(
        engine,
        "blob",
        &["len: i64", "Blob"],
        "A BLOB of len zero bytes (at most the array limit).",
        move |len: i64| -> RhaiResult<rhai::Blob> { Ok(vec![0; size("blob", "array", len, max)?]) },
    );
    def(
        engine,
        "blob",
        &["len: i64", "value: i64", "Blob"],
        "A BLOB of len bytes, each the byte value (at most the array limit).",
        move |len: i64, value: i64| -> RhaiResult<rhai::Blob> {
            Ok(vec![(value & 0xff) as u8; size("blob", "array", len, max)?])
        },
    );
    let max = limits.string;
    def(
        engine,
        "pad",
        &["string: &mut String", "len: i64", "character: char", "()"],
        "Pads the string to at least len characters with the character (at most the string limit).",
        move |s: &mut rhai::ImmutableString, len: i64, c: char| -> RhaiResult<()> {
            let n = size("pad", "string", len, max)?;
            let have = s.chars().count();
            if n > have {
                let mut t = s.to_string();
                t.extend(std::iter::repeat_n(c, n - have));
                *s = t.into();
            }
            Ok(())
        },
    );
    def(
        engine,
        "pad",
        &["string: &mut String", "len: i64", "padding: &str", "()"],
        "Pads the string to at least len characters with copies of padding (at most the string limit).",
        move |s: &mut rhai::ImmutableString, len: i64, pad: &str| -> RhaiResult<()> {
            let n = size("pad", "string", len, max)?;
            let mut t = s.to_string();
            let missing = n.saturating_sub(t.chars().count());
            if !pad.is_empty() {
                t.extend(pad.chars().cycle().take(missing));
            }
            *s = t.into();
            Ok(())
        },
    );
}

fn truthy(v: &Dynamic) -> bool {
    v.as_bool().unwrap_or(!v.is_unit())
}

/// The helpers, for an engine built under `limits`; `log()` counts from now.
pub(crate) fn register(engine: &mut Engine, limits: &Limits, powers: Powers) {
    // Writing a file is as much as running a command (a cron entry, a profile): only a
    // script that may run them.
    let may_write = move |func: &str| powers.check(Act::Run, func).map_err(script_err);
    let max_file = limits.string;
    let max_depth = limits.depth;
    register_sized(engine, limits);
    let start = Instant::now();
    // Typed overloads: they replace rhai's own sleep(), which Ctrl-C cannot interrupt.
    def(
        engine,
        "sleep",
        &["secs: i64", "()"],
        "Sleeps for secs seconds; Ctrl-C interrupts it.",
        |secs: i64| -> RhaiResult<()> { super::sleep(secs_arg(&Dynamic::from(secs), "sleep")?) },
    );
    def(
        engine,
        "sleep",
        &["secs: f64", "()"],
        "Sleeps for secs seconds (a float, e.g. 0.25); Ctrl-C interrupts it.",
        |secs: f64| -> RhaiResult<()> { super::sleep(secs_arg(&Dynamic::from(secs), "sleep")?) },
    );
    def(
        engine,
        "now",
        &["f64"],
        "Seconds since the Unix epoch, as a float (for timing: now() - t0).",
        || -> f64 {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64())
        },
    );
    def(
        engine,
        "log",
        &["msg: ?", "()"],
        "Writes a line to stderr with the seconds since gpuloop started: [  1.25s] msg.
         Any value is written as text.",
        move |msg: Dynamic| log_line(start, &msg),
    );
    // rhai's own log(FLOAT) is log10: log(now() - t0) must print, not compute and drop.
    def(
        engine,
        "log",
        &["msg: f64", "()"],
        "log() of a float: writes it (rhai's logarithm is log(x, 10.0) here).",
        move |msg: f64| log_line(start, &Dynamic::from(msg)),
    );
    def(
        engine,
        "log",
        &["msg: i64", "()"],
        "log() of an integer: writes it.",
        move |msg: i64| log_line(start, &Dynamic::from(msg)),
    );
    def(
        engine,
        "warn",
        &["msg: ?", "()"],
        "Writes a warning line to stderr (yellow on a terminal, unless NO_COLOR is set).
         Any value is written as text.",
        |msg: Dynamic| {
            let msg = msg.to_string();
            let msg = crate::shown::text(&msg);
            if crate::output::color_stderr() {
                crate::errln!("\x1b[33mwarning:\x1b[0m {msg}");
            } else {
                crate::errln!("warning: {msg}");
            }
        },
    );
    def(
        engine,
        "env",
        &["name: String", "String | ()"],
        "The value of an environment variable, or () when it is not set.",
        |name: ImmutableString| -> Dynamic {
            // This very gpuloop, as every job it starts has it (`runner::job` sets it there):
            // gpuloop's own environment is left as it was given.
            if name == "GPULOOP_EXE" {
                return std::env::current_exe()
                    .ok()
                    .and_then(|p| p.into_os_string().into_string().ok())
                    .map_or(Dynamic::UNIT, Dynamic::from);
            }
            std::env::var(name.as_str()).map_or(Dynamic::UNIT, Dynamic::from)
        },
    );
    def(
        engine,
        "read_file",
        &["path: String", "String"],
        "The whole file as a string (invalid UTF-8 is replaced). Only regular files of at most
         the string limit (--limit string, 256 MiB unless set): a FIFO, a device, a directory
         or a larger file is an error.",
        move |path: ImmutableString| -> RhaiResult<String> {
            read_regular(path.as_str(), max_file)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .map_err(|e| script_err(format!("read_file({path:?}): {e}")))
        },
    );
    def(
        engine,
        "write_file",
        &["path: String", "text: String", "()"],
        "Writes text to a file, replacing it (written to a temporary file, then renamed).
         Only regular files of yours or root's: a FIFO, a device, a directory or another
         account's file at path is an error, untouched; a symbolic link on the way is followed
         only when it is yours or root's.",
        move |path: ImmutableString, text: ImmutableString| -> RhaiResult<()> {
            may_write("write_file()")?;
            write_atomic(path.as_str(), text.as_bytes())
                .map_err(|e| script_err(format!("write_file({path:?}): {e}")))
        },
    );
    def(
        engine,
        "replace_in_file",
        &["path: String", "old: String", "new: String", "i64"],
        "Replaces every occurrence of old with new in a file; returns how many were replaced
         (0 leaves the file untouched).",
        move |path: ImmutableString,
              old: ImmutableString,
              new: ImmutableString|
              -> RhaiResult<i64> {
            may_write("replace_in_file()")?;
            if old.is_empty() {
                return Err(script_err("replace_in_file: old must not be empty"));
            }
            let text = read_regular(path.as_str(), max_file)
                .and_then(|b| {
                    String::from_utf8(b).map_err(|_| std::io::Error::other("not UTF-8 text"))
                })
                .map_err(|e| script_err(format!("replace_in_file({path:?}): {e}")))?;
            let n = text.matches(old.as_str()).count();
            if n > 0 {
                write_atomic(
                    path.as_str(),
                    text.replace(old.as_str(), new.as_str()).as_bytes(),
                )
                .map_err(|e| script_err(format!("replace_in_file({path:?}): {e}")))?;
            }
            Ok(n as i64)
        },
    );
    def(
        engine,
        "file_exists",
        &["path: String", "bool"],
        "True if the path exists (file or directory).",
        |path: ImmutableString| std::path::Path::new(path.as_str()).exists(),
    );
    def(
        engine,
        "parse_json",
        &["text: String", "?"],
        "Parses JSON into maps, arrays, strings, numbers, booleans and ().",
        |text: ImmutableString| -> RhaiResult<Dynamic> {
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| script_err(format!("parse_json: {e}")))?;
            rhai::serde::to_dynamic(v)
        },
    );
    def(
        engine,
        "to_json",
        &["value: ?", "String"],
        "Renders a value as JSON (maps, arrays, strings, numbers, booleans; () is null).",
        move |v: Dynamic| -> RhaiResult<String> {
            check_depth(&v, "to_json", max_depth)?;
            let json: serde_json::Value = rhai::serde::from_dynamic(&v).map_err(|_| {
                script_err(format!(
                    "to_json: a {} has no JSON form (maps, arrays, strings, numbers, booleans and () do)",
                    v.type_name()
                ))
            })?;
            serde_json::to_string(&json).map_err(to_script)
        },
    );
    def(
        engine,
        "exit",
        &["()"],
        "Ends the script with exit code 0.",
        || -> RhaiResult<()> { Err(exit_with(0)) },
    );
    def(
        engine,
        "exit",
        &["code: i64", "()"],
        "Ends the script with this exit code (0-255; any other number exits 1).",
        |code: i64| -> RhaiResult<()> { Err(exit_with(code)) },
    );
    def(
        engine,
        "exit",
        &["reason: ?", "()"],
        "Ends the script with exit code 1, printing the value (a message, a float, a bool,
         ...) to stderr: exit(\"GPU 3 still held\").",
        |reason: Dynamic| -> RhaiResult<()> { Err(exit_saying(1, reason.to_string())) },
    );
    def(
        engine,
        "usage",
        &["msg: ?", "()"],
        "Ends the script as a usage error: prints \"usage: MSG\" to stderr and exits 2, as
         commands do for bad arguments. For checking ARGS:
         if ARGS.len() == 0 { usage(\"clean.rhai GPU…\") }",
        |msg: Dynamic| -> RhaiResult<()> { Err(exit_saying(2, format!("usage: {msg}"))) },
    );
    def(
        engine,
        "trim",
        &["s: &mut String", "String"],
        "Trims whitespace from both ends of a string variable in place, and returns the
         trimmed string, so both `s.trim();` and `let t = run(cmd).stdout.trim();` work.",
        |s: &mut ImmutableString| -> ImmutableString {
            let t: ImmutableString = s.trim().into();
            *s = t.clone();
            t
        },
    );
    def(
        engine,
        "trimmed",
        &["s: String", "String"],
        "The string without whitespace at either end (the string itself is unchanged).",
        |s: ImmutableString| -> ImmutableString { s.trim().into() },
    );
    def(
        engine,
        "check_opts",
        &["func: String", "opts: Map | ()", "spec: Map", "Map"],
        "Checks a function's options the way the built-in functions do, for modules and
         recipes: spec maps each known option to its kind (\"int\", \"secs\", \"number\",
         \"bool\", \"string\", \"Fn\", \"map\", \"array\", \"selector\", \"any\"; several as
         \"int|string\"). An unknown option or a wrong type throws an error naming func and
         the option; () options are none. Returns the options map:
         let o = check_opts(\"mymod::f\", opts, #{timeout: \"secs\", quiet: \"bool\"});",
        |func: ImmutableString, opts: Dynamic, spec: rhai::Map| -> RhaiResult<rhai::Map> {
            check_spec(&func, &opts, &spec)
        },
    );
    def(
        engine,
        "retry",
        &["n: i64", "f: Fn", "?"],
        "Calls f (with the attempt number 1..n if it takes an argument) until it succeeds:
         neither throws nor returns false. Returns that value; after n failures rethrows the
         last error (or returns false).",
        |ctx: NativeCallContext, n: i64, f: FnPtr| -> RhaiResult<Dynamic> {
            if n < 1 {
                return Err(script_err(format!("retry: n must be at least 1, got {n}")));
            }
            let mut last: RhaiResult<Dynamic> = Ok(Dynamic::FALSE);
            for attempt in 1..=n {
                last = call(&ctx, &f, attempt);
                match &last {
                    Ok(v) if v.as_bool() != Ok(false) => return last,
                    Err(e) if matches!(**e, EvalAltResult::ErrorTerminated(..)) => return last,
                    // The last failure is rethrown: shown once, by whoever catches it.
                    Err(_) if attempt == n => {}
                    Ok(_) => crate::errln!("retry: attempt {attempt}/{n} returned false"),
                    Err(e) => crate::errln!(
                        "retry: attempt {attempt}/{n} failed:\n{}",
                        errors::describe(ctx.engine(), e, ctx.call_source())
                    ),
                }
            }
            last
        },
    );
    def(
        engine,
        "until",
        &["timeout_secs: i64 | f64", "f: Fn", "bool"],
        "Calls f every 50 ms until it returns true; true then, false once timeout_secs passed.",
        |ctx: NativeCallContext, timeout: Dynamic, f: FnPtr| -> RhaiResult<bool> {
            let end = Instant::now() + secs_arg(&timeout, "until")?;
            let mut attempt = 0;
            loop {
                attempt += 1;
                if truthy(&call(&ctx, &f, attempt)?) {
                    return Ok(true);
                }
                let now = Instant::now();
                if now >= end {
                    return Ok(false);
                }
                super::sleep((end - now).min(Duration::from_millis(50)))?;
            }
        },
    );
}

/// Ends the script with `code`, printing `message` where the script's errors go (after
/// its jobs are stopped; as `{"error": …}` under --json).
fn exit_saying(code: i64, message: String) -> Box<EvalAltResult> {
    Box::new(EvalAltResult::ErrorTerminated(
        Dynamic::from(crate::script::errors::ExitSaying { code, message }),
        Position::NONE,
    ))
}

/// `Exit::of_script` maps the code to the process status.
fn exit_with(code: i64) -> Box<EvalAltResult> {
    Box::new(EvalAltResult::ErrorTerminated(
        Dynamic::from(code),
        Position::NONE,
    ))
}

/// Reads a regular file of at most `limit` bytes (the script's string limit: a bigger one
/// could not be a string anyway), as every file gpuloop is handed is read.
fn read_regular(path: &str, limit: usize) -> std::io::Result<Vec<u8>> {
    let kind = crate::input::Kind {
        what: "script string, --limit string",
        limit: limit as u64,
    };
    crate::input::file(std::path::Path::new(path), kind).map_err(|e| match e {
        crate::input::ReadError::Io(e) => e,
        e => std::io::Error::other(e.to_string()),
    })
}

/// Replaces a regular file (or creates one) atomically; anything else at the path (a FIFO,
/// a device, another account's file, a link another account planted) is refused, never
/// replaced or followed (`journal::files::replace`).
pub(crate) fn write_atomic(path: &str, bytes: &[u8]) -> std::io::Result<()> {
    crate::journal::files::replace(std::path::Path::new(path), bytes).map_err(|e| match e {
        crate::journal::files::FileError::Io { source, .. } => source,
        crate::journal::files::FileError::Refused { why, .. } => {
            std::io::Error::other(format!("{why}; refused"))
        }
    })
}
