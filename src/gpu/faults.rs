//! What a GPU says about its own faults: its volatile ECC counts, remapped rows, retired
//! pages, the recovery action the driver asks for, and the Xid events the kernel log holds
//! for it (matched by bus id), each with what NVIDIA's Xid catalog says it means.
//!
//! Read only when asked (gpu(), `gpus`, diagnose), never on wait_clean's polling path.

use super::kmsg::{Clock, KernelLog, Record};
use super::Gpu;
use serde::{Deserialize, Serialize};

/// The most Xid events kept per GPU: the latest ones.
pub(crate) const MAX_EVENTS: usize = 32;

/// A GPU's faults (`gpu().faults`). A fact the GPU does not report (ECC off, a GPU that
/// remaps rows rather than retiring pages, a driver without recovery actions) is `()`:
/// not applicable, never an error.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Faults {
    /// Volatile ECC error counts (since the driver loaded).
    pub ecc: Option<Ecc>,
    /// Rows of memory remapped for errors (Ampere and newer).
    pub remapped_rows: Option<RemappedRows>,
    /// Pages retired for errors (older GPUs; those that remap rows say N/A).
    pub retired_pages: Option<RetiredPages>,
    /// What the driver says the GPU needs (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`).
    pub recovery_action: Option<RecoveryAction>,
    /// Persistence mode: the driver keeps the GPU initialised while no client has it open.
    /// Off, each job's first CUDA call pays the GPU's initialisation, and the last client's
    /// exit tears it down (`nvidia-smi -pm 1`, or nvidia-persistenced, turns it on).
    pub persistence_mode: Option<bool>,
    /// Xid events of this GPU in the kernel log, oldest first (the latest `MAX_EVENTS`), and
    /// SXid events of the NVSwitches its fabric goes through.
    pub xid: Vec<Xid>,
    /// Why the kernel log could not be read (then `xid` is empty for want of it, not
    /// because there were none).
    pub log_error: Option<String>,
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Ecc {
    pub corrected: i64,
    pub uncorrected: i64,
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct RemappedRows {
    /// Rows remapped for correctable errors.
    pub correctable: i64,
    /// Rows remapped for uncorrectable errors.
    pub uncorrectable: i64,
    /// A remap waits for the next GPU reset.
    pub pending: bool,
    /// A remap failed: NVIDIA says the GPU needs service.
    pub failure: bool,
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct RetiredPages {
    /// Pages retired for multiple single-bit errors.
    pub single_bit: i64,
    /// Pages retired for a double-bit error.
    pub double_bit: i64,
    /// A retirement waits for the next driver reload or reset.
    pub pending: bool,
}

/// What the driver says a GPU needs (NVML's `nvmlDeviceGpuRecoveryAction_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RecoveryAction {
    None,
    GpuReset,
    NodeReboot,
    DrainP2p,
    DrainAndReset,
    RecoverImexDomain,
    /// A value this gpuloop does not know (a newer driver's).
    Unknown,
}

impl RecoveryAction {
    /// The action NVML's value stands for.
    pub(crate) fn from_code(v: u64) -> RecoveryAction {
        match v {
            0 => RecoveryAction::None,
            1 => RecoveryAction::GpuReset,
            2 => RecoveryAction::NodeReboot,
            3 => RecoveryAction::DrainP2p,
            4 => RecoveryAction::DrainAndReset,
            5 => RecoveryAction::RecoverImexDomain,
            _ => RecoveryAction::Unknown,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RecoveryAction::None => "none",
            RecoveryAction::GpuReset => "gpu-reset",
            RecoveryAction::NodeReboot => "node-reboot",
            RecoveryAction::DrainP2p => "drain-p2p",
            RecoveryAction::DrainAndReset => "drain-and-reset",
            RecoveryAction::RecoverImexDomain => "recover-imex-domain",
            RecoveryAction::Unknown => "unknown",
        }
    }

    /// Every name, for the simulator's `--recovery` and the docs.
    pub const NAMES: &'static [&'static str] = &[
        "none",
        "gpu-reset",
        "node-reboot",
        "drain-p2p",
        "drain-and-reset",
        "recover-imex-domain",
    ];

    pub fn parse(name: &str) -> Option<RecoveryAction> {
        (0..=5)
            .map(RecoveryAction::from_code)
            .find(|a| a.as_str() == name)
    }

    /// NVML's value of this action.
    pub(crate) fn code(self) -> Option<u64> {
        (0..=5).find(|&c| RecoveryAction::from_code(c) == self)
    }

    /// What it asks of whoever runs the GPU.
    pub(crate) fn needs(self) -> Needs {
        match self {
            RecoveryAction::GpuReset | RecoveryAction::DrainAndReset => Needs::Reset,
            RecoveryAction::NodeReboot => Needs::Reboot,
            _ => Needs::Nothing,
        }
    }
}

/// What a fact says the GPU needs before it is fit for work again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Needs {
    Nothing,
    Reset,
    Reboot,
}

/// "xid", or "sxid" for an NVSwitch's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum XidKind {
    Xid,
    Sxid,
}

/// What NVIDIA's Xid catalog says to do first about an Xid (its "immediate action").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum XidAction {
    /// Nothing for this event itself (a consequence of another, or information).
    None,
    /// The application's own fault: fix or restart it; the GPU is fine.
    RestartApp,
    /// Reset the GPU (no process may hold it).
    ResetGpu,
    /// Reboot the node.
    RebootNode,
}

impl XidAction {
    pub fn as_str(self) -> &'static str {
        match self {
            XidAction::None => "none",
            XidAction::RestartApp => "restart-app",
            XidAction::ResetGpu => "reset-gpu",
            XidAction::RebootNode => "reboot-node",
        }
    }

    pub(crate) fn needs(self) -> Needs {
        match self {
            XidAction::ResetGpu => Needs::Reset,
            XidAction::RebootNode => Needs::Reboot,
            XidAction::None | XidAction::RestartApp => Needs::Nothing,
        }
    }
}

/// What NVIDIA's Xid catalog says an Xid comes from, as far as the GPU is concerned: the
/// application's own fault leaves the GPU fit for the next job; a hardware or a driver
/// (firmware) error does not until it is looked at, reset or rebooted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum XidCause {
    /// The application's own fault (a bad address, an illegal instruction, a timeout of its
    /// kernel), or the cleanup after one: the GPU stays usable.
    Application,
    /// The GPU's memory, links or bus: ECC errors, remaps, NVLink, fallen off the bus.
    Hardware,
    /// The driver or the GPU's firmware (its micro-controllers, the GSP), or the driver's
    /// own recovery action changing.
    Driver,
}

/// One Xid (or SXid) event from the kernel log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Xid {
    pub kind: XidKind,
    pub code: i64,
    /// When the kernel logged it, in seconds since the epoch (as `now()`).
    pub time: f64,
    /// The process the driver names, where it names one: the pid field the kernel writes
    /// before the name, never anything inside the name.
    pub pid: Option<i64>,
    /// The name the driver gives that process (its comm when it opened the GPU, at most 15
    /// bytes, which may hold anything but NUL, commas and `pid=` included): a claim of the
    /// process itself, read up to the first `, `.
    pub name: Option<String>,
    /// The driver's message.
    pub text: String,
    /// The bus id as the kernel wrote it (an SXid's is its NVSwitch's).
    pub bus_id: String,
    /// What it means, from NVIDIA's Xid catalog (`()` for a code not in gpuloop's table).
    pub meaning: Option<String>,
    /// What the catalog says to do first.
    pub action: Option<XidAction>,
    /// What the catalog says it comes from (`()` for a code not in gpuloop's table, and from
    /// an older gpuloop).
    #[serde(default)]
    pub cause: Option<XidCause>,
    /// Microseconds since boot: to tell whether a process that has the pid now is the one
    /// the driver named (it started before the event).
    #[serde(skip)]
    pub(crate) boot_us: u64,
}

impl Xid {
    /// "Xid 31 (a memory fault: …)".
    pub(crate) fn title(&self) -> String {
        let kind = match self.kind {
            XidKind::Xid => "Xid",
            XidKind::Sxid => "SXid",
        };
        match &self.meaning {
            Some(m) => format!("{kind} {} ({m})", self.code),
            None => format!("{kind} {}", self.code),
        }
    }

    /// What this event asks of the GPU: the catalog's action, or for Xid 154 the action its
    /// message names.
    pub(crate) fn needs(&self) -> Needs {
        self.action.map_or(Needs::Nothing, XidAction::needs)
    }

    /// Whether the driver wrote `comm` as the name of the process this event names: the
    /// text after the kernel's `name=` is that name and then `, ` (or the line's end). The
    /// name may hold `, ` itself, so it is matched whole against a process's own comm, never
    /// cut out of the line.
    pub(crate) fn names(&self, comm: &str) -> bool {
        let Some(after) = fields(&self.text).and_then(|f| f.after_name) else {
            return false;
        };
        after
            .strip_prefix(comm)
            .is_some_and(|rest| rest == "," || rest.starts_with(", "))
    }
}

/// One line of NVIDIA's Xid catalog, in gpuloop's own words.
pub(crate) struct Entry {
    pub code: i64,
    /// What happened.
    pub meaning: &'static str,
    /// What it comes from: the application's fault, or one the GPU keeps.
    pub cause: XidCause,
    /// What to do first.
    pub action: XidAction,
    /// What to look at, beyond the action.
    pub advice: &'static str,
}

/// The Xids GPU engineers meet most, after NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors):
/// what it comes from (the catalog's possible causes, and its immediate action: RESTART_APP
/// for the application's own faults), its immediate action, and the investigation it points to.
const CATALOG: &[Entry] = &[
    Entry {
        code: 8,
        meaning: "the GPU stopped processing (a channel timed out)",
        cause: XidCause::Application,
        action: XidAction::RestartApp,
        advice: "restart the application; if it recurs on this GPU, run its diagnostics",
    },
    Entry {
        code: 13,
        meaning: "graphics engine exception: usually an out-of-range access or an illegal instruction in a kernel",
        cause: XidCause::Application,
        action: XidAction::RestartApp,
        advice: "debug the kernel (compute-sanitizer); if other applications hit it on this GPU, suspect the hardware",
    },
    Entry {
        code: 31,
        meaning: "GPU memory page fault (MMU fault): a kernel touched an address it does not own",
        cause: XidCause::Application,
        action: XidAction::RestartApp,
        advice: "a memory fault in the application's kernel (compute-sanitizer finds it); the GPU itself is fine",
    },
    Entry {
        code: 43,
        meaning: "the GPU stopped a channel that faulted: the application's error, its context is gone",
        cause: XidCause::Application,
        action: XidAction::RestartApp,
        advice: "restart the application; the GPU stays usable",
    },
    Entry {
        code: 45,
        meaning: "preemptive cleanup after an earlier error (a context killed, or the application ended)",
        cause: XidCause::Application,
        action: XidAction::None,
        advice: "look at the Xid logged before it on this GPU: that is the cause",
    },
    Entry {
        code: 48,
        meaning: "double-bit ECC error: memory returned data it could not correct",
        cause: XidCause::Hardware,
        action: XidAction::ResetGpu,
        advice: "reset the GPU (that retires the page or remaps the row); if it recurs, have the GPU serviced",
    },
    Entry {
        code: 61,
        meaning: "internal micro-controller breakpoint or warning",
        cause: XidCause::Driver,
        action: XidAction::ResetGpu,
        advice: "reset the GPU; report it to NVIDIA if it recurs",
    },
    Entry {
        code: 62,
        meaning: "internal micro-controller halted",
        cause: XidCause::Driver,
        action: XidAction::ResetGpu,
        advice: "reset the GPU; report it to NVIDIA if it recurs",
    },
    Entry {
        code: 63,
        meaning: "ECC page retirement or row remap recorded: it takes effect at the next GPU reset",
        cause: XidCause::Hardware,
        action: XidAction::ResetGpu,
        advice: "reset the GPU when it is idle, to apply the remap",
    },
    Entry {
        code: 64,
        meaning: "ECC page retirement or row remap failed to be recorded",
        cause: XidCause::Hardware,
        action: XidAction::ResetGpu,
        advice: "reset the GPU; if remapping keeps failing, have the GPU serviced",
    },
    Entry {
        code: 69,
        meaning: "graphics engine class error: the application sent the GPU an invalid command",
        cause: XidCause::Application,
        action: XidAction::RestartApp,
        advice: "restart the application",
    },
    Entry {
        code: 74,
        meaning: "NVLink error",
        cause: XidCause::Hardware,
        action: XidAction::ResetGpu,
        advice: "reset the GPU (with its NVLink peers); if it recurs, check the links and have them serviced",
    },
    Entry {
        code: 79,
        meaning: "the GPU fell off the bus: the host can no longer reach it",
        cause: XidCause::Hardware,
        action: XidAction::RebootNode,
        advice: "reboot the node; if it recurs, check the GPU's seating, power and cooling",
    },
    Entry {
        code: 92,
        meaning: "high single-bit ECC error rate (corrected)",
        cause: XidCause::Hardware,
        action: XidAction::None,
        advice: "nothing now; if the rate stays high, have the GPU checked",
    },
    Entry {
        code: 94,
        meaning: "contained ECC error: only the application that touched the memory was stopped",
        cause: XidCause::Hardware,
        action: XidAction::RestartApp,
        advice: "restart the application; reset the GPU when it is idle to remap the row",
    },
    Entry {
        code: 95,
        meaning: "uncontained ECC error: every application on the GPU may be affected",
        cause: XidCause::Hardware,
        action: XidAction::ResetGpu,
        advice: "stop everything on the GPU and reset it (that remaps the row); if it recurs, have it serviced",
    },
    Entry {
        code: 109,
        meaning: "context switch timeout",
        cause: XidCause::Application,
        action: XidAction::RestartApp,
        advice: "restart the application; if it recurs, reset the GPU",
    },
    Entry {
        code: 119,
        meaning: "the GPU's system processor (GSP) did not answer the driver in time",
        cause: XidCause::Driver,
        action: XidAction::ResetGpu,
        advice: "reset the GPU; if it recurs, update the driver or report it to NVIDIA",
    },
    Entry {
        code: 120,
        meaning: "error in the GPU's system processor (GSP)",
        cause: XidCause::Driver,
        action: XidAction::ResetGpu,
        advice: "reset the GPU; if it recurs, update the driver or report it to NVIDIA",
    },
    Entry {
        code: 140,
        meaning: "unrecovered ECC error",
        cause: XidCause::Hardware,
        action: XidAction::ResetGpu,
        advice: "reset the GPU; if it recurs, have it serviced",
    },
    Entry {
        code: 154,
        meaning: "the driver changed the GPU's recovery action (its message says which)",
        cause: XidCause::Driver,
        action: XidAction::None,
        advice: "do what the message asks: a GPU reset, or a node reboot",
    },
];

/// The catalog's line for `code`, if gpuloop's table has it.
pub(crate) fn catalog(code: i64) -> Option<&'static Entry> {
    CATALOG.iter().find(|e| e.code == code)
}

/// The catalog's codes (for the docs and the tests).
pub fn catalog_codes() -> Vec<i64> {
    CATALOG.iter().map(|e| e.code).collect()
}

/// A PCI address as the driver and the kernel write it: NVML's `00000000:3B:00.0`, the
/// kernel's `0000:3b:00` (no function, as Xids name GPUs) or `0000:b3:00.0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pci {
    domain: u32,
    bus: u32,
    device: u32,
    function: Option<u32>,
}

impl Pci {
    pub(crate) fn parse(text: &str) -> Option<Pci> {
        let text = text.trim();
        let text = text.strip_prefix("PCI:").unwrap_or(text);
        let hex = |s: &str| u32::from_str_radix(s, 16).ok();
        let mut parts: Vec<&str> = text.split(':').collect();
        // "3b:00.0": no domain, the first one.
        let domain = match parts.len() {
            3 => hex(parts.remove(0))?,
            2 => 0,
            _ => return None,
        };
        let (device, function) = match parts[1].split_once('.') {
            Some((d, f)) => (hex(d)?, Some(hex(f)?)),
            None => (hex(parts[1])?, None),
        };
        Some(Pci {
            domain,
            bus: hex(parts[0])?,
            device,
            function,
        })
    }

    /// The same device; a function is compared only where both name one.
    pub(crate) fn same(&self, other: &Pci) -> bool {
        (self.domain, self.bus, self.device) == (other.domain, other.bus, other.device)
            && match (self.function, other.function) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }

    /// As the kernel names a GPU in an Xid: `PCI:0000:18:00`.
    pub(crate) fn kernel_name(&self) -> String {
        format!(
            "PCI:{:04x}:{:02x}:{:02x}",
            self.domain, self.bus, self.device
        )
    }
}

/// An Xid line read. The driver writes (open-gpu-kernel-modules, `krcReportXid`):
/// `NVRM: Xid (PCI:0000:00:06): 31, pid=477, name=python3, channel …`, under MIG
/// `NVRM: Xid (PCI:0000:65:00 GPU-I:01 GPU-CI:00): 43, pid=…`, without a process
/// `NVRM: Xid (0000:01:00): 13, Graphics SM Warp Exception …`; older drivers
/// `NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the
/// bus.`; an NVSwitch's `NVRM: SXid (PCI:0000:b3:00.0): 12028, …`. Each part is read where
/// the kernel writes it: the pid right after the code, before the name, so that nothing the
/// name holds (commas, `pid=`) moves it.
pub(crate) fn parse_xid(r: &Record, clock: &Clock) -> Option<(Pci, Xid)> {
    let text = r.message.strip_prefix("NVRM:")?.trim_start();
    let f = fields(text)?;
    let pci = Pci::parse(f.bus)?;
    let name = f.after_name.map(|after| {
        // The name up to its first `, `: the whole name unless the name holds one itself
        // (then `names` tells a process's comm from it).
        let end = after.find(", ").unwrap_or(after.len());
        after[..end].trim_end_matches(',')
    });
    let name = name.filter(|v| !v.is_empty() && !v.starts_with('<') && *v != "N/A");
    let entry = (f.kind == XidKind::Xid).then(|| catalog(f.code)).flatten();
    let action = match (entry, f.code) {
        // Xid 154 names the recovery action it changed to.
        (Some(e), 154) => recovery_changed_to(text)
            .map(|a| match a.needs() {
                Needs::Reboot => XidAction::RebootNode,
                Needs::Reset => XidAction::ResetGpu,
                Needs::Nothing => e.action,
            })
            .or(Some(e.action)),
        (e, _) => e.map(|e| e.action),
    };
    Some((
        pci,
        Xid {
            kind: f.kind,
            code: f.code,
            time: clock.wall_of(r.boot_us),
            pid: f.pid,
            name: name.map(str::to_string),
            text: text.to_string(),
            bus_id: f.bus.to_string(),
            meaning: entry.map(|e| e.meaning.to_string()),
            action,
            cause: entry.map(|e| e.cause),
            boot_us: r.boot_us,
        },
    ))
}

/// The parts of an Xid line (after `NVRM: `), each where the driver writes it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Fields<'a> {
    kind: XidKind,
    /// The PCI address in the parentheses (without the MIG instances after it).
    bus: &'a str,
    code: i64,
    /// The pid field, where the driver names a process (`pid=477`, older `pid='477'`).
    pid: Option<i64>,
    /// What follows `name=`: the name, `, `, and the driver's message.
    after_name: Option<&'a str>,
}

/// Reads `Xid (BUS[ MIG]): CODE[, pid=PID, name=NAME][, MESSAGE]`. The parts before the name
/// are the kernel's alone: the bus and the code, then the pid field, digits or a quoted word,
/// with no `, ` in it.
fn fields(text: &str) -> Option<Fields<'_>> {
    let (kind, rest) = if let Some(rest) = text.strip_prefix("SXid (") {
        (XidKind::Sxid, rest)
    } else {
        (XidKind::Xid, text.strip_prefix("Xid (")?)
    };
    let (attr, rest) = rest.split_once(')')?;
    let bus = attr.split(' ').next()?;
    let rest = rest.strip_prefix(':')?.trim_start();
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let code: i64 = rest[..digits].parse().ok()?;
    let rest = &rest[digits..];
    let (pid, after_name) = match rest.strip_prefix(", pid=") {
        Some(p) => {
            let end = p.find(", ").unwrap_or(p.len());
            let pid = p[..end].trim_matches('\'').parse::<i64>().ok();
            (pid.filter(|&p| p > 0), p[end..].strip_prefix(", name="))
        }
        None => (None, None),
    };
    Some(Fields {
        kind,
        bus,
        code,
        pid,
        after_name,
    })
}

/// The recovery action an Xid 154 says the driver changed to: `GPU recovery action changed
/// from 0x0 (None) to 0x2 (Node Reboot Required)`, by its number. The last such message in the
/// line is the driver's (a name, at most 15 bytes, cannot hold this one).
fn recovery_changed_to(text: &str) -> Option<RecoveryAction> {
    const SAID: &str = "GPU recovery action changed from ";
    let said = &text[text.rfind(SAID)? + SAID.len()..];
    let to = said.split_once(" to ")?.1;
    let hex = to.strip_prefix("0x")?;
    let digits = hex.bytes().take_while(u8::is_ascii_hexdigit).count();
    u64::from_str_radix(&hex[..digits], 16)
        .ok()
        .map(RecoveryAction::from_code)
}

/// The faults a backend read of one GPU (no Xids: those come from the kernel log).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceFaults {
    pub index: i64,
    /// Its PCI bus id (NVML's form), to match the kernel log's events to it.
    pub bus_id: String,
    pub faults: Faults,
}

/// Gives each of `gpus` its faults: what the backend read of it (`read`, by index) and the
/// events `log` has for it. A GPU the backend read nothing of still gets its events.
pub(crate) fn attach(mut gpus: Vec<&mut Gpu>, read: Vec<DeviceFaults>, log: &dyn KernelLog) {
    let mut by_gpu: Vec<Faults> = gpus
        .iter()
        .map(|g| {
            read.iter()
                .find(|d| d.index == g.index)
                .map(|d| d.faults.clone())
                .unwrap_or_default()
        })
        .collect();
    let buses: Vec<Option<Pci>> = gpus
        .iter()
        .map(|g| {
            let own = read.iter().find(|d| d.index == g.index).map(|d| &d.bus_id);
            [own.map(String::as_str), Some(g.bus_id.as_str())]
                .into_iter()
                .flatten()
                .find_map(Pci::parse)
        })
        .collect();
    match log.records() {
        Err(e) => {
            for f in &mut by_gpu {
                f.log_error = Some(e.to_string());
            }
        }
        Ok(records) => {
            let clock = Clock::now();
            for (pci, xid) in records.iter().filter_map(|r| parse_xid(r, &clock)) {
                for (f, bus) in by_gpu.iter_mut().zip(&buses) {
                    // An NVSwitch serves every GPU of its fabric.
                    let ours = xid.kind == XidKind::Sxid || bus.is_some_and(|b| b.same(&pci));
                    if ours {
                        f.xid.push(xid.clone());
                    }
                }
            }
            for f in &mut by_gpu {
                let extra = f.xid.len().saturating_sub(MAX_EVENTS);
                f.xid.drain(..extra);
            }
        }
    }
    for (g, f) in gpus.iter_mut().zip(by_gpu) {
        g.faults = Some(f);
    }
}

impl Faults {
    /// The latest Xid that asks for something (a reset, a reboot), with what it asks.
    pub(crate) fn latest_need(&self) -> Option<(&Xid, Needs)> {
        self.xid
            .iter()
            .rev()
            .filter(|x| x.kind == XidKind::Xid)
            .map(|x| (x, x.needs()))
            .find(|(_, n)| *n > Needs::Nothing)
    }

    /// The latest Xid of this GPU.
    pub(crate) fn latest(&self) -> Option<&Xid> {
        self.xid.iter().rev().find(|x| x.kind == XidKind::Xid)
    }

    /// The Xid the GPU fell off the bus with.
    pub(crate) fn off_bus(&self) -> Option<&Xid> {
        self.xid
            .iter()
            .rev()
            .find(|x| x.kind == XidKind::Xid && x.code == 79)
    }

    pub(crate) fn remap_pending(&self) -> bool {
        self.remapped_rows.is_some_and(|r| r.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(message: &str) -> Record {
        Record {
            boot_us: 1_000_000,
            message: message.into(),
        }
    }

    const CLOCK: Clock = Clock {
        wall: 1_800_000_000.0,
        boot: 100.0,
    };

    #[test]
    fn bus_ids_match_in_every_form_the_driver_and_the_kernel_write() {
        let nvml = Pci::parse("00000000:00:06.0").unwrap();
        for kernel in [
            "PCI:0000:00:06",
            "0000:00:06",
            "PCI:0000:00:06.0",
            "00:06.0",
        ] {
            assert!(nvml.same(&Pci::parse(kernel).unwrap()), "{kernel}");
        }
        let b = Pci::parse("00000000:3B:00.0").unwrap();
        assert!(b.same(&Pci::parse("PCI:0000:3b:00").unwrap()));
        assert!(!b.same(&Pci::parse("PCI:0000:3c:00").unwrap()));
        assert!(!b.same(&Pci::parse("PCI:0000:3b:00.1").unwrap()));
        assert!(!b.same(&Pci::parse("PCI:0001:3b:00").unwrap()));
        assert_eq!(b.kernel_name(), "PCI:0000:3b:00");
        for bad in ["", "PCI:", "zz:00", "3b", "1:2:3:4", "0000:3b:0x"] {
            assert_eq!(Pci::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn xid_lines_of_every_driver_read() {
        // Driver 580 on an H200.
        let (pci, x) = parse_xid(
            &rec("NVRM: Xid (PCI:0000:00:06): 31, pid=477, name=python3, channel 0x0000000a, intr 00000000. MMU Fault: ENGINE GRAPHICS"),
            &CLOCK,
        )
        .unwrap();
        assert!(pci.same(&Pci::parse("00000000:00:06.0").unwrap()));
        assert_eq!((x.kind, x.code, x.pid), (XidKind::Xid, 31, Some(477)));
        assert_eq!(x.name.as_deref(), Some("python3"));
        assert_eq!(x.action, Some(XidAction::RestartApp));
        assert!(x.meaning.as_deref().unwrap().contains("page fault"));
        assert_eq!(x.time, 1_800_000_000.0 - 99.0);
        assert!(x.text.starts_with("Xid (PCI:0000:00:06): 31, pid=477"));
        // Older drivers: the pid unknown.
        let (_, x) = parse_xid(
            &rec("NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."),
            &CLOCK,
        )
        .unwrap();
        assert_eq!((x.code, x.pid, x.name.clone()), (79, None, None));
        assert_eq!(x.action, Some(XidAction::RebootNode));
        // No pid at all, no "PCI:", a pid in quotes, N/A.
        let (_, x) = parse_xid(
            &rec("NVRM: Xid (0000:01:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0)"),
            &CLOCK,
        )
        .unwrap();
        assert_eq!((x.code, x.pid), (13, None));
        let (_, x) = parse_xid(
            &rec("NVRM: Xid (PCI:0000:65:00): 119, pid='N/A', Timeout waiting for RPC from GSP"),
            &CLOCK,
        )
        .unwrap();
        assert_eq!(
            (x.code, x.pid, x.action),
            (119, None, Some(XidAction::ResetGpu))
        );
        let (_, x) = parse_xid(
            &rec("NVRM: Xid (PCI:0000:18:00): 43, pid='1234', name=python, Ch 00000008"),
            &CLOCK,
        )
        .unwrap();
        assert_eq!((x.pid, x.name.as_deref()), (Some(1234), Some("python")));
        // An NVSwitch's SXid.
        let (pci, x) = parse_xid(
            &rec("NVRM: SXid (PCI:0000:b3:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)"),
            &CLOCK,
        )
        .unwrap();
        assert_eq!(
            (x.kind, x.code, x.meaning.clone()),
            (XidKind::Sxid, 12028, None)
        );
        assert_eq!(pci.function, Some(0));
        // Xid 154 names the action it changed to.
        let (_, x) = parse_xid(&rec("NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"), &CLOCK).unwrap();
        assert_eq!(x.action, Some(XidAction::RebootNode));
        // Not Xids.
        for other in [
            "NVRM: GPU at PCI:0000:18:00: GPU-abc",
            "NVRM: Xid (PCI:0000:18:00)",
            "NVRM: Xid (PCI:0000:18:00): x, pid=1",
            "NVRM: Xid (nonsense): 31, pid=1",
        ] {
            assert_eq!(parse_xid(&rec(other), &CLOCK), None, "{other}");
        }
    }

    /// The pid is the kernel's field before the name, whatever the name holds: a process
    /// that names itself `x, pid=1` (15 bytes of anything but NUL) cannot point the Xid at
    /// pid 1; the name is matched whole against a comm; the MIG instances after the bus are
    /// not part of it; and Xid 154's action is its number, not a word the name could hold.
    #[test]
    fn the_pid_is_where_the_kernel_writes_it_whatever_the_name_holds() {
        let line = |name: &str, msg: &str| {
            rec(&format!(
                "NVRM: Xid (PCI:0000:65:00): 31, pid=4242, name={name}, {msg}"
            ))
        };
        for name in [
            "x, pid=1",
            "x, pid=1, name=",
            ", pid=1,",
            "pid=1",
            "a,b, c",
            "\x1b[2J, pid=7",
            "name=y, pid=9",
        ] {
            let (_, x) = parse_xid(&line(name, "channel 0x0000000a"), &CLOCK).unwrap();
            assert_eq!(x.pid, Some(4242), "{name:?}");
            assert!(x.names(name), "{name:?} is the name the driver wrote");
            // A comm is matched up to a `, ` the driver wrote after it: a part of the name
            // that ends elsewhere is no comm it wrote.
            assert!(!x.names(&name[..name.len() - 1]), "{name:?}");
            assert!(!x.names("python3"), "{name:?}");
        }
        // A name written at the end of the line (no message after it), and a name the
        // driver did not write.
        let (_, x) = parse_xid(
            &rec("NVRM: Xid (PCI:0000:65:00): 43, pid=7, name=a, b,"),
            &CLOCK,
        )
        .unwrap();
        assert!(
            x.names("a, b") && x.names("a"),
            "both read as the driver wrote them"
        );
        let (_, x) = parse_xid(&line("python3", "Ch 00000008"), &CLOCK).unwrap();
        assert_eq!(x.name.as_deref(), Some("python3"));
        assert!(x.names("python3") && !x.names("python") && !x.names("python3, Ch"));
        let (_, x) = parse_xid(
            &rec("NVRM: Xid (PCI:0000:65:00): 13, Graphics SM Warp Exception, pid=1, name=x"),
            &CLOCK,
        )
        .unwrap();
        assert_eq!(
            (x.pid, x.name.as_deref()),
            (None, None),
            "no pid field: the message's words are no pid"
        );
        assert!(!x.names("x"));
        // Under MIG: the instances after the bus.
        let (pci, x) = parse_xid(&rec("NVRM: Xid (PCI:0000:65:00 GPU-I:01 GPU-CI:00): 43, pid=88, name=python3, Ch 00000008"), &CLOCK).unwrap();
        assert!(pci.same(&Pci::parse("00000000:65:00.0").unwrap()));
        assert_eq!(
            (x.code, x.pid, x.bus_id.as_str()),
            (43, Some(88), "PCI:0000:65:00")
        );
        // Xid 154: the action it changed to, by number; a name cannot change it.
        for (name, to, want) in [
            ("Node Reboot", "0x0 (None)", XidAction::None),
            (
                "GPU Reset",
                "0x2 (Node Reboot Required)",
                XidAction::RebootNode,
            ),
            ("x", "0x1 (GPU Reset Required)", XidAction::ResetGpu),
            ("x", "0x4 (Drain and Reset)", XidAction::ResetGpu),
        ] {
            let (_, x) = parse_xid(&rec(&format!("NVRM: Xid (PCI:0000:65:00): 154, pid=5, name={name}, GPU recovery action changed from 0x0 (None) to {to}")), &CLOCK).unwrap();
            assert_eq!(x.action, Some(want), "{name} {to}");
        }
    }

    #[test]
    fn the_catalog_covers_the_common_xids() {
        for code in [
            13, 31, 43, 45, 48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120,
        ] {
            assert!(catalog(code).is_some(), "Xid {code}");
        }
        // The application's own faults leave the GPU fit: none of them asks for a reset or a
        // reboot; the common application ones are classed so.
        for e in CATALOG {
            if e.cause == XidCause::Application {
                assert!(e.action.needs() == Needs::Nothing, "Xid {}", e.code);
            }
        }
        for code in [13, 31, 43, 45] {
            assert_eq!(
                catalog(code).map(|e| e.cause),
                Some(XidCause::Application),
                "Xid {code}"
            );
        }
        for code in [48, 63, 64, 74, 79, 92, 94, 95] {
            assert_eq!(
                catalog(code).map(|e| e.cause),
                Some(XidCause::Hardware),
                "Xid {code}"
            );
        }
        let codes = catalog_codes();
        let mut sorted = codes.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(codes, sorted, "one line per code, in order");
    }

    #[test]
    fn recovery_actions_read_as_nvml_numbers_them() {
        for (n, name) in RecoveryAction::NAMES.iter().enumerate() {
            let a = RecoveryAction::from_code(n as u64);
            assert_eq!(a.as_str(), *name);
            assert_eq!(RecoveryAction::parse(name), Some(a));
            assert_eq!(a.code(), Some(n as u64));
            assert_eq!(serde_json::to_value(a).unwrap(), *name);
        }
        assert_eq!(RecoveryAction::from_code(77), RecoveryAction::Unknown);
        assert_eq!(RecoveryAction::GpuReset.needs(), Needs::Reset);
        assert_eq!(RecoveryAction::DrainAndReset.needs(), Needs::Reset);
        assert_eq!(RecoveryAction::NodeReboot.needs(), Needs::Reboot);
        assert_eq!(RecoveryAction::DrainP2p.needs(), Needs::Nothing);
    }

    struct Fixed(Vec<Record>);
    impl KernelLog for Fixed {
        fn records(&self) -> Result<Vec<Record>, super::super::kmsg::LogError> {
            Ok(self.0.clone())
        }
    }

    #[test]
    fn events_go_to_the_gpu_of_their_bus_and_switch_events_to_every_gpu() {
        let mut gpus = [
            Gpu::new(
                0,
                0,
                "GPU-a".into(),
                "H200".into(),
                "00000000:18:00.0".into(),
                1,
                0,
                vec![],
            ),
            Gpu::new(
                1,
                1,
                "GPU-b".into(),
                "H200".into(),
                String::new(),
                1,
                0,
                vec![],
            ),
        ];
        let read = vec![DeviceFaults {
            index: 1,
            bus_id: "00000000:19:00.0".into(),
            faults: Faults {
                ecc: Some(Ecc {
                    corrected: 0,
                    uncorrected: 2,
                }),
                ..Faults::default()
            },
        }];
        let mut records: Vec<Record> = (0..40)
            .map(|i| Record {
                boot_us: i,
                message: format!(
                    "NVRM: Xid (PCI:0000:18:00): 31, pid={}, name=python3",
                    i + 1
                ),
            })
            .collect();
        records.push(rec("NVRM: Xid (PCI:0000:19:00): 48, pid=9, name=python3"));
        records.push(rec("NVRM: SXid (PCI:0000:b3:00.0): 12028, Non-fatal"));
        records.push(rec(
            "NVRM: Xid (PCI:0000:77:00): 79, GPU has fallen off the bus.",
        ));
        attach(gpus.iter_mut().collect(), read, &Fixed(records));
        let f0 = gpus[0].faults.as_ref().unwrap();
        assert_eq!(f0.xid.len(), MAX_EVENTS, "the latest ones only");
        assert_eq!(f0.xid.last().unwrap().kind, XidKind::Sxid);
        assert_eq!(f0.xid[MAX_EVENTS - 2].pid, Some(40));
        assert_eq!(f0.ecc, None);
        let f1 = gpus[1].faults.as_ref().unwrap();
        let codes: Vec<i64> = f1.xid.iter().map(|x| x.code).collect();
        assert_eq!(codes, [48, 12028]);
        assert_eq!(f1.ecc.unwrap().uncorrected, 2);
        assert_eq!(
            f1.latest_need().map(|(x, n)| (x.code, n)),
            Some((48, Needs::Reset))
        );
    }
}
