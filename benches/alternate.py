#!/usr/bin/env python3
"""Times commands side by side with their trials interleaved: hyperfine's `-N` runs, but one
trial of each command per round, in turn, instead of every trial of one command and then every
trial of the next. On a shared machine, load that comes and goes moved the ratio of two
commands measured back to back by up to 0.5x; interleaved, a noisy moment falls on all of them.
Each round runs the commands forward, the next backward (AB BA AB ...), so no command always
runs right after another. A command with fewer runs than the others (one that takes seconds)
has its trials spread evenly over the rounds.

    benches/alternate.py [OPTIONS] [-n NAME] COMMAND [[OPTIONS] [-n NAME] COMMAND ...]

Options apply to the commands after them, until given again:
    --runs N         trials of each command (default 10)
    --warmup N       untimed runs of each command first, interleaved too (default 0)
    --prepare CMD    a shell command run before each trial (and warm-up) of the command,
                     untimed, as hyperfine's --prepare; --prepare '' for none
    --shell          run the commands through `sh -c` (default: split into words, no shell,
                     as hyperfine -N)
    --ok CODES       exit codes that count as success, comma-separated (default 0)
and, once, anywhere:
    --export-json F  hyperfine's JSON layout: results[] with command, mean, stddev, median,
                     user, system, min, max, times, exit_codes (seconds); plus "order":
                     "interleaved" and each command's "ratio" to the first command's median
    --quiet          no per-command lines on stdout

Prints, per command, the median and spread and its ratio to the first command. Times are wall
clock from start to exit of each process (os.wait4 gives its user and system CPU); no shell
start-up is subtracted, so a figure may be a fraction of a millisecond above hyperfine's.
Exits non-zero if a trial exits with a code not in --ok (as hyperfine does without -i).
"""
import json, os, shlex, statistics, subprocess, sys, time


class Cmd:
    def __init__(self, text, name, runs, warmup, prepare, shell, ok):
        self.text, self.name, self.runs, self.warmup = text, name or text, runs, warmup
        self.prepare, self.shell, self.ok = prepare, shell, ok
        self.times, self.user, self.system, self.codes = [], [], [], []

    def argv(self):
        return ["sh", "-c", self.text] if self.shell else shlex.split(self.text)

    def once(self):
        """One trial: the prepare step (untimed), then the command, timed. Returns its
        wall time, user and system CPU (s) and exit code."""
        if self.prepare:
            subprocess.run(["sh", "-c", self.prepare], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t = time.perf_counter()
        p = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, ru = os.wait4(p.pid, 0)
        dt = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode not in self.ok:
            raise SystemExit(f"alternate.py: {self.name!r} exited {p.returncode} "
                             f"(run it alone to see why)")
        return dt, ru.ru_utime, ru.ru_stime, p.returncode


def parse(argv):
    cmds, runs, warmup, prepare, shell, ok = [], 10, 0, None, False, (0,)
    name, out, quiet = None, None, False
    it = iter(argv)
    for a in it:
        if a == "--runs":
            runs = int(next(it))
        elif a == "--warmup":
            warmup = int(next(it))
        elif a == "--prepare":
            prepare = next(it) or None
        elif a == "--shell":
            shell = True
        elif a == "--ok":
            ok = tuple(int(c) for c in next(it).split(","))
        elif a in ("-n", "--command-name"):
            name = next(it)
        elif a == "--export-json":
            out = next(it)
        elif a == "--quiet":
            quiet = True
        elif a.startswith("-"):
            raise SystemExit(f"alternate.py: unknown option {a}\n\n{__doc__}")
        else:
            cmds.append(Cmd(a, name, runs, warmup, prepare, shell, ok))
            name = None
    if not cmds:
        raise SystemExit(__doc__)
    return cmds, out, quiet


def schedule(cmds, trials):
    """Rounds of (command, warm-up?) pairs: each command's trials spread evenly over the
    rounds, every other round backward."""
    rounds = max(trials(c) for c in cmds)
    plan = []
    for r in range(rounds):
        order = cmds if r % 2 == 0 else cmds[::-1]
        # Command c runs in round r when its evenly spread count steps up there.
        plan.append([c for c in order if (r + 1) * trials(c) // rounds > r * trials(c) // rounds])
    return plan


def main():
    cmds, out, quiet = parse(sys.argv[1:])
    for rnd in schedule(cmds, lambda c: c.warmup):
        for c in rnd:
            c.once()
    for rnd in schedule(cmds, lambda c: c.runs):
        for c in rnd:
            dt, u, s, code = c.once()
            c.times.append(dt)
            c.user.append(u)
            c.system.append(s)
            c.codes.append(code)
    ref = statistics.median(cmds[0].times)
    results = []
    for i, c in enumerate(cmds):
        ts = c.times
        r = {"command": c.name, "mean": statistics.mean(ts),
             "stddev": statistics.stdev(ts) if len(ts) > 1 else 0.0,
             "median": statistics.median(ts), "user": statistics.mean(c.user),
             "system": statistics.mean(c.system), "min": min(ts), "max": max(ts),
             "times": ts, "exit_codes": c.codes, "ratio": statistics.median(ts) / ref}
        results.append(r)
        if not quiet:
            print(f"Benchmark {i + 1}: {c.name}")
            print(f"  Time (median … mean ± σ):  {r['median'] * 1e3:8.2f} ms … "
                  f"{r['mean'] * 1e3:.2f} ms ± {r['stddev'] * 1e3:.2f} ms   "
                  f"[min {r['min'] * 1e3:.2f}, max {r['max'] * 1e3:.2f}; {len(ts)} runs]")
            if i:
                print(f"  {r['ratio']:.3f}× the median of {cmds[0].name}")
    if out:
        with open(out, "w") as f:
            json.dump({"results": results, "order": "interleaved"}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
