//! gpuloop brings itself to a host that has none: over the ssh session that would run the
//! agent, a small POSIX shell script finds a usable gpuloop (on the PATH, or a copy of this
//! very binary in the remote user's cache, `${XDG_CACHE_HOME:-~/.cache}/gpuloop`, its SHA-256
//! checked before it runs), and otherwise receives this binary there, where it can run.
//!
//! The conversation, before the agent's hello (each line on the session's stdio):
//! - remote: `gpuloop-push ARCH LIBC` (`uname -m`, `getconf GNU_LIBC_VERSION`)
//! - local: `HASH` (SHA-256 of this binary), or nothing (the session is closed) where this
//!   binary cannot run there; the remote runs its cached copy if it has one, else says
//!   `gpuloop-send`
//! - remote: `gpuloop-send` followed by the decompressors it has (`xz`, `gzip`)
//! - local: `SIZE FORMAT`, then the binary's bytes in that format (`xz`, where the host has
//!   it: 5 MB of a 17.6 MB build, where gzip sends 7 MB; else `gzip`; else none); the remote
//!   stores them in a temporary file of the cache, checks the hash, renames it into place,
//!   and runs it.

use std::sync::{Arc, OnceLock};

/// What a host says before it is sent anything.
pub(crate) const ASK: &str = "gpuloop-push ";
/// The remote has no copy of this binary: send it (followed by the decompressors the host
/// has: ` xz gzip`).
pub(crate) const SEND: &str = "gpuloop-send";
/// The script's exit code where the cache refused the copy (EX_CANTCREAT's neighbour,
/// EX_TEMPFAIL: sysexits.h).
pub(crate) const CANNOT_STORE: i32 = 75;

/// The remote command: a POSIX sh script in one line, with no `!` and no newline (a csh or
/// fish login shell passes it to sh untouched). `skip_path`: the gpuloop on the PATH spoke
/// another protocol, so only this binary's copy will do.
///
/// The cache is trusted only as sudo and ssh trust a directory: every component of its path,
/// up to `/`, is no link, belongs to the remote user or root, and is writable by no one else
/// (a root-owned sticky directory such as /tmp excepted: others cannot rename or remove what
/// is in it). Otherwise nothing is kept, written or run there (exit 75, saying which
/// component and why). The copy arrives in a file `mktemp` creates exclusively, under a new
/// name, and what runs is a regular file of the remote user's whose SHA-256 was checked at
/// that file: hashed once, when it was stored, and trusted after that while its inode, size
/// and mtime are the ones its sidecar (`F.id`, checked by the same rules) recorded with the
/// hash. It comes compressed with xz, or gzip, where the host has one of them.
pub(crate) fn script(skip_path: bool) -> String {
    let version = env!("CARGO_PKG_VERSION");
    let mut s = String::new();
    if !skip_path {
        s.push_str("command -v gpuloop >/dev/null 2>&1 && exec gpuloop agent; ");
    }
    s.push_str(&format!(
        "D=\"${{XDG_CACHE_HOME:-$HOME/.cache}}/gpuloop\"; u=$(id -u); \
         echo \"{ASK}$(uname -m) $(getconf GNU_LIBC_VERSION 2>/dev/null)\"; \
         read -r H || exit 0; \
         case \"$H\" in *[a-f0-9]*) ;; *) exit 0;; esac; \
         F=\"$D/gpuloop-{version}-$(printf %s \"$H\" | cut -c1-16)\"; \
         bad() {{ echo \"gpuloop: not keeping or running a copy of gpuloop under $1: $2\" >&2; exit 75; }}; \
         safe() {{ p=$1; while :; do \
           [ -L \"$p\" ] && bad \"$p\" \"it is a symbolic link\"; \
           s=$(stat -c \"%u %a\" \"$p\") || bad \"$p\" \"cannot read its owner\"; o=${{s% *}}; m=${{s#* }}; \
           [ \"$o\" = \"$u\" ] || [ \"$o\" = 0 ] || bad \"$p\" \"it belongs to uid $o, not to uid $u or root\"; \
           if [ $((0$m & 022)) -ne 0 ]; then [ \"$o\" = 0 ] && [ $((0$m & 01000)) -ne 0 ] || bad \"$p\" \"others may write to it (mode $m)\"; fi; \
           [ \"$p\" = / ] && return 0; p=$(dirname \"$p\"); done; }}; \
         mine() {{ [ -L \"$1\" ] && return 1; [ -f \"$1\" ] && [ \"$(stat -c %u \"$1\")\" = \"$u\" ]; }}; \
         ok() {{ mine \"$F\" || return 1; I=$(stat -c \"%i %s %Y\" \"$F\") || return 1; \
           mine \"$F.id\" && [ \"$(cat \"$F.id\")\" = \"$I $H\" ] && return 0; \
           [ \"$(sha256sum < \"$F\")\" = \"$H  -\" ] || return 1; \
           S=$(mktemp \"$D/.id-XXXXXX\") && printf \"%s\\n\" \"$I $H\" > \"$S\" && mv -f \"$S\" \"$F.id\"; return 0; }}; \
         if [ -e \"$D\" ] || [ -L \"$D\" ]; then safe \"$D\"; ok && exec \"$F\" agent; fi; \
         Z=; for z in xz gzip; do type $z >/dev/null 2>&1 && Z=\"$Z $z\"; done; echo \"{SEND}$Z\"; \
         read -r N C || exit 0; case \"$C\" in xz|gzip) ;; *) C=;; esac; \
         umask 077; mkdir -p \"$D\" || exit 75; safe \"$D\"; \
         T=$(mktemp \"$D/.gpuloop-XXXXXX\") || exit 75; \
         if [ -n \"$C\" ]; then head -c \"$N\" | \"$C\" -dc > \"$T\"; else head -c \"$N\" > \"$T\"; fi || {{ rm -f \"$T\"; exit 75; }}; \
         chmod 700 \"$T\" && rm -f \"$F.id\" && mv -f \"$T\" \"$F\" || {{ rm -f \"$T\"; exit 75; }}; \
         ok && exec \"$F\" agent; \
         echo \"gpuloop: the copy received in $F does not match its SHA-256\" >&2; rm -f \"$F\" \"$F.id\"; exit 75"
    ));
    format!("sh -c '{s}'")
}

/// The largest binary sent as xz: a release build (17 MB) takes about a second of CPU to
/// compress, once per run; a debug build (240 MB) would take half a minute, and goes as gzip.
const XZ_AT_MOST: usize = 64 << 20;

/// This binary, read once per run and only when some host needs it.
pub(crate) struct Exe {
    pub bytes: Vec<u8>,
    /// SHA-256, hex.
    pub hash: String,
    /// The oldest glibc it runs on (`GLIBC_2.x` symbol versions it needs); `None` for one
    /// that needs none (static).
    pub glibc: Option<(u32, u32)>,
    gz: OnceLock<Vec<u8>>,
    xz: OnceLock<Option<Vec<u8>>>,
}

impl Exe {
    /// The bytes sent to a host that said it has the decompressors `has` (`xz gzip`), and
    /// their format: xz, else gzip, else as they are.
    pub(crate) fn for_host(&self, has: &str) -> (&[u8], &'static str) {
        let has = |z: &str| has.split_whitespace().any(|w| w == z);
        if has("xz") && self.bytes.len() <= XZ_AT_MOST {
            if let Some(xz) = self.xz() {
                return (xz, "xz");
            }
        }
        match has("gzip") {
            true => (self.gzipped(), "gzip"),
            false => (&self.bytes, ""),
        }
    }

    /// The bytes as xz (preset 0, on up to 8 threads), made once per run; `None` where
    /// liblzma could not make them (the host then gets gzip).
    fn xz(&self) -> Option<&[u8]> {
        self.xz
            .get_or_init(|| {
                use std::io::Write;
                let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
                let stream = xz2::stream::MtStreamBuilder::new()
                    .preset(0)
                    .threads(threads as u32)
                    .check(xz2::stream::Check::Crc64)
                    .encoder()
                    .or_else(|_| {
                        xz2::stream::Stream::new_easy_encoder(0, xz2::stream::Check::Crc64)
                    })
                    .ok()?;
                let mut z = xz2::write::XzEncoder::new_stream(Vec::new(), stream);
                z.write_all(&self.bytes).ok()?;
                z.finish().ok()
            })
            .as_deref()
    }

    /// The bytes gzipped, as a host with gzip receives them (made once per run).
    pub(crate) fn gzipped(&self) -> &[u8] {
        self.gz.get_or_init(|| {
            use std::io::Write;
            let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            // Writing to a Vec fails only where allocating does.
            let _ = z.write_all(&self.bytes);
            z.finish().unwrap_or_default()
        })
    }
}

pub(crate) fn exe() -> Result<Arc<Exe>, String> {
    static EXE: OnceLock<Result<Arc<Exe>, String>> = OnceLock::new();
    EXE.get_or_init(|| {
        use sha2::Digest;
        let bytes = std::fs::read("/proc/self/exe")
            .map_err(|e| format!("cannot read this gpuloop (/proc/self/exe): {e}"))?;
        let hash = sha2::Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let glibc = glibc_needed(&bytes);
        Ok(Arc::new(Exe {
            bytes,
            hash,
            glibc,
            gz: OnceLock::new(),
            xz: OnceLock::new(),
        }))
    })
    .clone()
}

/// Why this binary cannot run on a host that said `ARCH LIBC` (`x86_64 glibc 2.36`).
pub(crate) fn cannot_run(said: &str, exe: &Exe) -> Option<String> {
    let mut w = said.split_whitespace();
    let arch = w.next().unwrap_or("");
    let ours = std::env::consts::ARCH;
    if arch != ours {
        return Some(format!(
            "this gpuloop is built for {ours}, and that host is {}",
            if arch.is_empty() {
                "of unknown architecture"
            } else {
                arch
            }
        ));
    }
    let (libc, version) = (w.next(), w.next());
    if let Some((maj, min)) = exe.glibc {
        let theirs = version
            .and_then(parse_version)
            .filter(|_| libc == Some("glibc"));
        match theirs {
            None => {
                return Some(format!(
                    "this gpuloop needs glibc {maj}.{min} or newer, and that host has no glibc"
                ))
            }
            Some(t) if t < (maj, min) => {
                return Some(format!(
                    "this gpuloop needs glibc {maj}.{min} or newer, and that host has {}.{}",
                    t.0, t.1
                ))
            }
            Some(_) => {}
        }
    }
    None
}

fn parse_version(v: &str) -> Option<(u32, u32)> {
    let mut p = v.split('.');
    let maj = p.next()?.parse().ok()?;
    let min = p.next().map_or(Some(0), |m| {
        m.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .ok()
    })?;
    Some((maj, min))
}

/// The newest `GLIBC_2.x` an ELF file's symbol versions need (its `.gnu.version_r`).
pub(crate) fn glibc_needed(elf: &[u8]) -> Option<(u32, u32)> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(elf.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(elf.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(elf.get(o..o + 8)?.try_into().ok()?));
    // 64-bit little-endian only: what gpuloop is built as.
    if elf.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let shoff = u64_at(0x28)? as usize;
    let (shentsize, shnum) = (u16_at(0x3a)? as usize, u16_at(0x3c)? as usize);
    let section = |i: usize| {
        let h = shoff + i * shentsize;
        Some((
            u32_at(h + 4)?,
            u64_at(h + 0x18)? as usize,
            u64_at(h + 0x20)? as usize,
            u32_at(h + 0x28)? as usize,
        ))
    };
    const SHT_GNU_VERNEED: u32 = 0x6fff_fffe;
    let (_, off, _, link) = (0..shnum)
        .filter_map(section)
        .find(|s| s.0 == SHT_GNU_VERNEED)?;
    let (_, strtab, strsize, _) = section(link)?;
    let name = |o: usize| {
        let s = elf.get(strtab + o..strtab + strsize)?;
        let end = s.iter().position(|b| *b == 0)?;
        std::str::from_utf8(&s[..end]).ok()
    };
    let mut best: Option<(u32, u32)> = None;
    let mut vn = off;
    for _ in 0..4096 {
        let (cnt, aux, next) = (u16_at(vn + 2)?, u32_at(vn + 8)?, u32_at(vn + 12)?);
        let mut a = vn + aux as usize;
        for _ in 0..cnt {
            if let Some(v) = name(u32_at(a + 8)? as usize)
                .and_then(|n| n.strip_prefix("GLIBC_"))
                .and_then(parse_version)
            {
                best = best.max(Some(v));
            }
            a += u32_at(a + 12)? as usize;
        }
        if next == 0 {
            break;
        }
        vn += next as usize;
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_binarys_glibc_need_is_read_from_its_symbol_versions() {
        let me = std::fs::read("/proc/self/exe").unwrap();
        let (maj, min) = glibc_needed(&me).expect("a glibc build needs some GLIBC_2.x");
        assert_eq!(maj, 2);
        assert!((2..=60).contains(&min), "{min}");
        assert_eq!(glibc_needed(b"#!/bin/sh\n"), None);
    }

    #[test]
    fn a_host_of_another_architecture_or_an_older_glibc_is_refused() {
        let exe = Exe {
            bytes: Vec::new(),
            hash: String::new(),
            glibc: Some((2, 34)),
            gz: OnceLock::new(),
            xz: OnceLock::new(),
        };
        let arch = std::env::consts::ARCH;
        assert_eq!(cannot_run(&format!("{arch} glibc 2.36"), &exe), None);
        assert_eq!(cannot_run(&format!("{arch} glibc 2.34"), &exe), None);
        let old = cannot_run(&format!("{arch} glibc 2.31"), &exe).unwrap();
        assert!(
            old.contains("needs glibc 2.34 or newer") && old.contains("has 2.31"),
            "{old}"
        );
        let musl = cannot_run(arch, &exe).unwrap();
        assert!(musl.contains("no glibc"), "{musl}");
        let other = if arch == "aarch64" {
            "x86_64"
        } else {
            "aarch64"
        };
        let e = cannot_run(&format!("{other} glibc 2.36"), &exe).unwrap();
        assert!(e.contains(&format!("that host is {other}")), "{e}");
    }

    fn exe_of(bytes: Vec<u8>) -> Exe {
        Exe {
            bytes,
            hash: String::new(),
            glibc: None,
            gz: OnceLock::new(),
            xz: OnceLock::new(),
        }
    }

    /// What `xz -dc` or `gzip -dc` (the commands the remote script runs) make of `sent`.
    fn decompressed(tool: &str, sent: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut c = std::process::Command::new(tool)
            .arg("-dc")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{tool} (xz-utils, gzip; .ci/run installs them): {e}"));
        let mut stdin = c.stdin.take().unwrap();
        let sent = sent.to_vec();
        let writer = std::thread::spawn(move || stdin.write_all(&sent));
        let out = c.wait_with_output().unwrap();
        writer.join().unwrap().unwrap();
        assert!(out.status.success(), "{tool} -dc failed");
        out.stdout
    }

    /// The first push of a 17.6 MB release build sent 7.8 MB to each host as gzip (the budget
    /// in BENCHMARKS.md is 6 MB): a host that has xz now gets xz (5 MB), one with gzip alone gzip,
    /// one with neither the bytes as they are; each decompresses to the very bytes.
    #[test]
    fn a_host_gets_xz_where_it_has_xz_else_gzip_else_the_bytes() {
        let bytes: Vec<u8> = (0..3_000_000u32)
            .flat_map(|i| (i % 7919).to_le_bytes())
            .collect();
        let exe = exe_of(bytes.clone());
        let (sent, format) = exe.for_host(" xz gzip");
        assert_eq!(format, "xz");
        assert!(sent.len() < exe.gzipped().len(), "xz is the smaller");
        assert_eq!(decompressed("xz", sent), bytes);
        let (sent, format) = exe.for_host(" gzip");
        assert_eq!(format, "gzip");
        assert_eq!(decompressed("gzip", sent), bytes);
        let (sent, format) = exe.for_host("");
        assert_eq!((sent, format), (&bytes[..], ""));
        // A binary too large to xz in a moment (a debug build) goes as gzip.
        let big = exe_of(vec![0; XZ_AT_MOST + 1]);
        assert_eq!(big.for_host(" xz gzip").1, "gzip");
    }

    #[test]
    fn the_script_is_one_line_without_bang() {
        for skip in [false, true] {
            let s = script(skip);
            assert!(!s.contains('\n') && !s.contains('!'), "{s}");
            assert_eq!(s.matches('\'').count(), 2, "{s}");
            assert_eq!(s.contains("command -v gpuloop"), !skip);
        }
    }
}
