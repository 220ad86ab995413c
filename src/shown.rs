//! Text another user chose (a process's name and command line, user, cgroup, pod and container names, kernel log text), made safe where it is written for a person: control characters shown escaped, never emitted.
//!
//! A comm or an argv can hold any byte but NUL: ESC starts the terminal's CSI and OSC
//! sequences (erase a line, move the cursor, set the clipboard), `\r` rewrites a line, C1
//! characters (U+0080–U+009F) are the same controls in 8 bits, and the bidi controls (U+202E
//! and its kin) reorder what follows. Each is shown as an escape (`\x1b`, `\u{202e}`) instead.
//!
//! Three strengths, for three places:
//! - [`shown`]: one field of a record (a name, a command line, advice that quotes them):
//!   every control escaped, a newline too, so a field stays on its line.
//! - [`text`]: a message written as lines (a script's `print`, an error with its caret):
//!   newlines and tabs kept, every other control escaped.
//! - [`terminal`]: what `src/output.rs` writes, the net under both: as `text`, and where the
//!   stream has colour, gpuloop's own colour sequences kept.
//!
//! `--json` is exact data: [`json`] writes it with these characters as JSON's `\u` escapes,
//! which a JSON reader decodes back to the same string.

use std::borrow::Cow;
use std::fmt;

/// Whether `c` is shown escaped wherever text is written for a person: C0 controls, DEL,
/// C1 controls, and the characters that reorder or break lines in a terminal or an editor
/// (bidi embeddings, overrides, isolates and marks; the line and paragraph separators).
pub(crate) fn is_control(c: char) -> bool {
    matches!(
        c,
        '\0'..='\x1f'
            | '\x7f'..='\u{9f}'
            | '\u{061c}'
            | '\u{200e}'
            | '\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}'
    )
}

/// How `c` is shown: `\x1b` for C0 and DEL, `\u{9b}` for the rest.
fn escape(c: char, out: &mut impl fmt::Write) -> fmt::Result {
    if (c as u32) < 0x80 {
        write!(out, "\\x{:02x}", c as u32)
    } else {
        write!(out, "\\u{{{:x}}}", c as u32)
    }
}

/// One field of a record as a person sees it: every control character escaped, newlines
/// and tabs too. `format!("{}", shown(&h.name))`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shown<'a>(&'a str);

/// `s` for a person, as one field: see [`Shown`].
pub(crate) fn shown(s: &str) -> Shown<'_> {
    Shown(s)
}

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(at) = rest.find(is_control) {
            f.write_str(&rest[..at])?;
            let c = rest[at..].chars().next().unwrap_or_default();
            escape(c, f)?;
            rest = &rest[at + c.len_utf8()..];
        }
        f.write_str(rest)
    }
}

/// A message written as lines (a script's `print`, `log` and `warn`, an error with its
/// source line): newlines and tabs kept, every other control character escaped.
pub(crate) fn text(s: &str) -> Cow<'_, str> {
    escaped(s, |_| None)
}

/// What gpuloop writes to a terminal or a pipe: as [`text`], and with `colour` the colour
/// sequences gpuloop itself writes kept (`ESC [ … m` of the few it uses: bold, dim, the
/// foreground colours of its tables and logs, and their resets). A sequence that hides text
/// (conceal, a background colour, reverse video) or moves anything is escaped like any other.
pub(crate) fn terminal(s: &str, colour: bool) -> Cow<'_, str> {
    escaped(s, |rest| colour.then(|| own_sgr(rest)).flatten())
}

/// `s` with every control escaped except newlines, tabs and what `keep` accepts at an ESC
/// (the length it keeps); borrowed when there is nothing to escape.
fn escaped(s: &str, keep: impl Fn(&str) -> Option<usize>) -> Cow<'_, str> {
    let bad = |c: char| is_control(c) && c != '\n' && c != '\t';
    let Some(first) = s.find(bad) else {
        return Cow::Borrowed(s);
    };
    let mut out = String::with_capacity(s.len() + 16);
    out.push_str(&s[..first]);
    let mut rest = &s[first..];
    while let Some(at) = rest.find(bad) {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        if let Some(n) = rest.starts_with('\x1b').then(|| keep(rest)).flatten() {
            out.push_str(&rest[..n]);
            rest = &rest[n..];
            continue;
        }
        let c = rest.chars().next().unwrap_or_default();
        let _ = escape(c, &mut out);
        rest = &rest[c.len_utf8()..];
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// The length of the colour sequence `s` starts with, if it is one gpuloop writes: SGR
/// (`ESC [ params m`) whose every parameter is reset, bold, dim, italic, their ends, a
/// foreground colour 31–36 or the default (39), or a 256-colour foreground 1–15 (`38;5;N`,
/// what the tables' colours are); `None` for anything else.
fn own_sgr(s: &str) -> Option<usize> {
    let body = s.strip_prefix("\x1b[")?;
    let end = body.find(|c: char| !(c.is_ascii_digit() || c == ';'))?;
    if body.as_bytes()[end] != b'm' {
        return None;
    }
    let params: Vec<&str> = body[..end].split(';').collect();
    let mut i = 0;
    while i < params.len() {
        match params[i] {
            "" | "0" | "1" | "2" | "3" | "22" | "23" | "39" => i += 1,
            "31" | "32" | "33" | "34" | "35" | "36" => i += 1,
            "38" if params.get(i + 1) == Some(&"5") => {
                let n: u8 = params.get(i + 2)?.parse().ok()?;
                if !(1..=15).contains(&n) || n == 8 {
                    return None;
                }
                i += 3;
            }
            _ => return None,
        }
    }
    Some("\x1b[".len() + end + 1)
}

/// `v` as JSON for a person's terminal or a program (`--json`, MCP's text): exact data, with
/// the characters [`is_control`] names written as `\u` escapes (serde_json escapes only C0),
/// so that no raw control reaches a terminal while any JSON reader reads the same strings.
pub(crate) fn json(v: &impl serde::Serialize, pretty: bool) -> Result<String, serde_json::Error> {
    let mut out = Vec::with_capacity(128);
    if pretty {
        let mut ser = serde_json::Serializer::with_formatter(
            &mut out,
            Escaping(serde_json::ser::PrettyFormatter::new()),
        );
        v.serialize(&mut ser)?;
    } else {
        let mut ser = serde_json::Serializer::with_formatter(
            &mut out,
            Escaping(serde_json::ser::CompactFormatter),
        );
        v.serialize(&mut ser)?;
    }
    // serde_json writes UTF-8 only.
    Ok(String::from_utf8(out).unwrap_or_default())
}

/// A JSON formatter that writes the characters serde_json leaves raw (DEL, C1, the bidi
/// controls) as `\u` escapes, and is `F` for the rest.
struct Escaping<F>(F);

macro_rules! delegate {
    ($($name:ident($($arg:ident: $t:ty),*);)*) => {
        $(
            fn $name<W: ?Sized + std::io::Write>(&mut self, w: &mut W $(, $arg: $t)*) -> std::io::Result<()> {
                self.0.$name(w $(, $arg)*)
            }
        )*
    };
}

impl<F: serde_json::ser::Formatter> serde_json::ser::Formatter for Escaping<F> {
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut rest = fragment;
        while let Some(at) = rest.find(is_control) {
            self.0.write_string_fragment(w, &rest[..at])?;
            let c = rest[at..].chars().next().unwrap_or_default();
            // Every character is_control names is in the Basic Multilingual Plane.
            write!(w, "\\u{:04x}", c as u32)?;
            rest = &rest[at + c.len_utf8()..];
        }
        self.0.write_string_fragment(w, rest)
    }

    delegate! {
        write_null();
        write_bool(value: bool);
        write_i8(value: i8);
        write_i16(value: i16);
        write_i32(value: i32);
        write_i64(value: i64);
        write_i128(value: i128);
        write_u8(value: u8);
        write_u16(value: u16);
        write_u32(value: u32);
        write_u64(value: u64);
        write_u128(value: u128);
        write_f32(value: f32);
        write_f64(value: f64);
        write_number_str(value: &str);
        begin_string();
        end_string();
        write_char_escape(char_escape: serde_json::ser::CharEscape);
        write_byte_array(value: &[u8]);
        begin_array();
        end_array();
        begin_array_value(first: bool);
        end_array_value();
        begin_object();
        end_object();
        begin_object_key(first: bool);
        end_object_key();
        begin_object_value();
        end_object_value();
        write_raw_fragment(fragment: &str);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every class of control is shown escaped in a field, newline and tab included, and
    /// ordinary text (UTF-8 too) is left as it is.
    #[test]
    fn a_field_shows_every_control_escaped() {
        let cases = [
            ("python3", "python3"),
            ("naïve 名前", "naïve 名前"),
            ("\x1b[2J\x1b[Hclean", "\\x1b[2J\\x1b[Hclean"),
            ("a\nb\tc\rd", "a\\x0ab\\x09c\\x0dd"),
            ("\x1b]52;c;aGk=\x07", "\\x1b]52;c;aGk=\\x07"),
            ("del\x7f", "del\\x7f"),
            ("\u{9b}2J", "\\u{9b}2J"),
            ("\u{85}", "\\u{85}"),
            ("abc\u{202e}fdp.exe", "abc\\u{202e}fdp.exe"),
            (
                "\u{2066}\u{2069}\u{200f}\u{61c}\u{2028}",
                "\\u{2066}\\u{2069}\\u{200f}\\u{61c}\\u{2028}",
            ),
        ];
        for (raw, want) in cases {
            assert_eq!(shown(raw).to_string(), want, "{raw:?}");
        }
    }

    /// Text written as lines keeps its lines; the terminal's net keeps gpuloop's own colours
    /// where the stream has colour, and nothing that moves the cursor, hides text or writes
    /// elsewhere.
    #[test]
    fn lines_and_own_colours_are_kept_and_nothing_else() {
        assert!(matches!(text("one\n\ttwo"), Cow::Borrowed(_)));
        assert_eq!(text("a\x1b[2Kb\rc\n"), "a\\x1b[2Kb\\x0dc\n");
        let own =
            "\x1b[1mGPU\x1b[0m \x1b[38;5;10m0\x1b[39m \x1b[31mred\x1b[0m \x1b[2;3mdim\x1b[22;23m";
        assert_eq!(terminal(own, true), own);
        assert_eq!(
            terminal("\x1b[1mGPU\x1b[0m", false),
            "\\x1b[1mGPU\\x1b[0m",
            "no colour: no escape sequence at all"
        );
        for hostile in [
            "\x1b[8m",
            "\x1b[30;40m",
            "\x1b[7m",
            "\x1b[38;5;0m",
            "\x1b[38;2;0;0;0m",
            "\x1b[1;8m",
            "\x1b[2K",
            "\x1b[1A",
            "\x1b]0;title\x07",
            "\x1b[",
            "\x1b",
        ] {
            let out = terminal(hostile, true);
            assert!(!out.contains('\x1b'), "{hostile:?} kept: {out:?}");
        }
    }

    /// JSON keeps the exact strings, with no raw control: serde_json escapes C0, and the rest
    /// is written as `\u` escapes that read back the same.
    #[test]
    fn json_is_exact_and_has_no_raw_control() {
        let v =
            serde_json::json!({"name": "a\x1b[2J\u{9b}\u{202e}\x7f\nz", "n": [1, 2.5, null, true]});
        for pretty in [false, true] {
            let s = json(&v, pretty).unwrap();
            assert!(!s.chars().any(|c| is_control(c) && c != '\n'), "{s:?}");
            assert!(
                s.contains("\\u001b")
                    && s.contains("\\u009b")
                    && s.contains("\\u202e")
                    && s.contains("\\u007f"),
                "{s}"
            );
            let back: serde_json::Value = serde_json::from_str(&s).unwrap();
            assert_eq!(back, v);
            assert_eq!(s.contains('\n'), pretty, "{s}");
        }
    }
}
