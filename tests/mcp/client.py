"""A real MCP client (the official Python SDK, PyPI `mcp`) driving `gpuloop mcp` over stdio.

Run by the Rust integration suite (tests/mcp.rs), one scenario per call:

    python client.py SCENARIO

The environment carries what the Rust test set up: GPULOOP_BIN (the binary), MCP_SERVER_ARGS
(JSON list), MCP_SERVER_ENV (JSON map: the simulator's state, XDG dirs), MCP_PLANTED (JSON:
the pids the test planted). Every check raises with a message; exit status 0 means all passed.
"""

import json
import os
import re
import sys
import time

import anyio
from jsonschema import Draft202012Validator
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

BIN = os.environ["GPULOOP_BIN"]
SERVER_ARGS = json.loads(os.environ["MCP_SERVER_ARGS"])
SERVER_ENV = json.loads(os.environ["MCP_SERVER_ENV"])
PLANTED = json.loads(os.environ.get("MCP_PLANTED", "{}"))
JOURNAL = os.path.join(SERVER_ENV["XDG_STATE_HOME"], "gpuloop", "journal.jsonl")

READ_TOOLS = {"gpus", "holders", "diagnose", "wait_clean", "recipes"}
ALL_TOOLS = READ_TOOLS | {"kill", "clean", "run", "run_recipe"}


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except OSError:
        return False


async def gone_within(pid, secs):
    end = time.monotonic() + secs
    while time.monotonic() < end:
        if not alive(pid):
            return True
        await anyio.sleep(0.02)
    return not alive(pid)


def journal():
    """The MCP calls journaled (the journal also has a record of every signal)."""
    return [r for r in records() if r["kind"] == "call"]


def records():
    if not os.path.exists(JOURNAL):
        return []
    with open(JOURNAL) as f:
        return [json.loads(line) for line in f if line.strip()]


async def wait_journal(pred, secs, what):
    end = time.monotonic() + secs
    while time.monotonic() < end:
        hits = [e for e in journal() if pred(e)]
        if hits:
            return hits[-1]
        await anyio.sleep(0.05)
    raise AssertionError(f"no journal entry {what} within {secs}s: {journal()}")


def server(args=None, cwd=None):
    return StdioServerParameters(command=BIN, args=args or SERVER_ARGS, env=SERVER_ENV, cwd=cwd)


# Each tool's declared outputSchema, read once per client process (one server's tools).
OUTPUT_SCHEMAS = {}


async def conforms(session, name, r):
    """The structured content, of a normal or an error result, matches the tool's outputSchema."""
    if not OUTPUT_SCHEMAS:
        OUTPUT_SCHEMAS.update({t.name: t.output_schema for t in (await session.list_tools()).tools})
    schema = OUTPUT_SCHEMAS.get(name)
    check(schema is not None, f"{name}: no outputSchema")
    errors = [e.message for e in Draft202012Validator(schema).iter_errors(r.structured_content)]
    check(not errors, f"{name}: structured content does not match its outputSchema: {errors}: {r.structured_content}")


def texts(name, r):
    """The text content a model sees: a one-line summary, then the same record as JSON."""
    check(r.content and r.content[0].type == "text", f"{name}: no text summary: {r}")
    summary = r.content[0].text
    check("\n" not in summary and summary, f"{name}: summary is not one line: {summary!r}")
    check(isinstance(r.structured_content, dict), f"{name}: no structured content: {r}")
    check(
        json.loads(r.content[1].text) == r.structured_content,
        f"{name}: the JSON text differs from the structured content",
    )
    return summary


async def call(session, name, args=None, **kw):
    r = await session.call_tool(name, args or {}, **kw)
    summary = texts(name, r)
    await conforms(session, name, r)
    print(f"  {name}: {summary}")
    return r


async def tool_error(session, name, args, *says):
    """A call the model must read about and can correct: a tool result with isError, whose
    text content says each of `says`, never a JSON-RPC error."""
    try:
        r = await session.call_tool(name, args)
    except MCPError as e:
        raise AssertionError(f"{name} {args}: a protocol error ({e.code} {e.message}), not a tool result")
    check(r.is_error is True, f"{name} {args}: isError is {r.is_error}: {r}")
    summary = texts(name, r)
    for what in says:
        check(what in summary, f"{name} {args}: the text a model sees does not say {what!r}: {summary}")
    await conforms(session, name, r)
    print(f"  {name}: error result: {summary[:90]}")
    return r


async def refused(session, name, args, flag, allows="read-only"):
    """A refusal says what this server allows (issue 33, item 9: a server started with
    `--allow clean` said "(read-only by default)")."""
    r = await tool_error(session, name, args, f"refused: `{name}`", f"`gpuloop mcp --allow {flag}`", f"which is {allows}.")
    check("by default" not in r.content[0].text, f"{name}: {r.content[0].text}")
    want = {"refused": True, "tool": name, "allow": flag}
    check(r.structured_content == want, f"{name}: refusal structured content {r.structured_content}")


async def read_only():
    """initialize, tools and schemas, diagnose of a planted orphan, refusals, dry runs, journal."""
    orphan, daemon = PLANTED["orphan"], PLANTED["daemon"]
    calls = []
    async with stdio_client(server()) as (read, write):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            check(init.server_info.name == "gpuloop", f"server info {init.server_info}")
            check(init.capabilities.tools is not None, "no tools capability")
            check("read-only" in (init.instructions or ""), f"instructions: {init.instructions}")

            tools = (await s.list_tools()).tools
            check({t.name for t in tools} == ALL_TOOLS, f"tools: {[t.name for t in tools]}")
            for t in tools:
                Draft202012Validator.check_schema(t.input_schema)
                check(t.input_schema.get("type") == "object", f"{t.name}: schema not an object")
                check(len(t.description or "") > 60, f"{t.name}: description too short")
                check(t.annotations.read_only_hint == (t.name in READ_TOOLS), f"{t.name}: hints")
            # The schemas accept what a model would send and reject what it must not.
            kill_schema = Draft202012Validator(next(t for t in tools if t.name == "kill").input_schema)
            check(kill_schema.is_valid({"targets": [12, {"pid": 12, "start": 99, "name": "x"}]}), "kill schema")
            check(not kill_schema.is_valid({"targets": [12], "sudo": True}), "kill schema is open")
            print(f"  tools/list: {len(tools)} tools, schemas valid")

            r = await call(s, "diagnose", {"gpus": [1]})
            calls.append(("diagnose", "ok"))
            d = r.structured_content["gpus"][0]
            check(d["verdict"] == "orphaned", f"verdict {d['verdict']}: {d}")
            check(orphan in [h["pid"] for h in d["holders"]], f"orphan {orphan} not among {d['holders']}")
            check("orphaned" in r.content[0].text, r.content[0].text)

            r = await call(s, "holders", {"all": True})
            calls.append(("holders", "ok"))
            roles = {h["pid"]: h["role"] for h in r.structured_content["holders"]}
            check(roles.get(orphan) == "compute" and roles.get(daemon) == "daemon", f"roles {roles}")

            await refused(s, "clean", {}, "clean")
            calls.append(("clean", "refused"))
            holder = next(h for h in r.structured_content["holders"] if h["pid"] == orphan)
            await refused(s, "kill", {"targets": [holder]}, "kill")
            calls.append(("kill", "refused"))
            check(alive(orphan), "a refused call signalled the orphan")

            r = await call(s, "clean", {"dry_run": True})
            calls.append(("clean", "ok"))
            check(orphan in r.structured_content["would_signal"], f"dry run: {r.structured_content}")
            check(r.structured_content["signalled"] == [], f"dry run signalled: {r.structured_content}")
            check(r.structured_content["dry_run"] is True, "dry run flag")
            check(alive(orphan), "a dry run signalled the orphan")

            await tool_error(s, "wait_clean", {"timeout": -1}, "wait_clean: timeout")
            calls.append(("wait_clean", "error"))

            r = await call(s, "wait_clean", {"gpus": [0], "timeout": 5})
            calls.append(("wait_clean", "ok"))
            check(r.structured_content["clean"] is True, f"GPU 0 (daemon, 0 MiB) not clean: {r.structured_content}")

            r = await call(s, "recipes")
            calls.append(("recipes", "ok"))
            check("clean-node" in [x["name"] for x in r.structured_content["recipes"]], f"recipes: {r.structured_content}")
            await refused(s, "run_recipe", {"name": "clean-node"}, "recipes")
            calls.append(("run_recipe", "refused"))

    got = [(e["tool"], e["result"]) for e in journal()]
    check(got == calls, f"journal {got} != calls {calls}")
    for e in journal():
        check(e["time"].endswith("Z") and e["gpuloop_pid"] > 0 and "arguments" in e, f"entry {e}")
        check(e["front_end"] == "mcp" and e["user"]["name"] and e["host"], f"entry {e}")
    check(not [r for r in records() if r["kind"] == "signal"], "a read-only server journaled a signal")
    check(journal()[1]["arguments"] == {"all": True}, f"arguments not journaled: {journal()[1]}")
    print(f"  journal: {len(got)} lines, one per call")


async def done_when():
    """Given only `gpuloop mcp --sim 8x80G --allow clean`: find the orphaned workers of the
    demo mess, clean them, and show the verification."""
    workers, keep = PLANTED["workers"], PLANTED["keep"]
    progress = []

    async def on_progress(done, total, message):
        progress.append((done, total, message))

    async with stdio_client(server()) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            r = await call(s, "diagnose")
            verdicts = {d["gpu"]: d["verdict"] for d in r.structured_content["gpus"]}
            check(all(verdicts[g] == "orphaned" for g in range(6)), f"verdicts {verdicts}")
            check(verdicts[6] == "inherited", f"GPU 6: {verdicts[6]}")
            found = {h["pid"] for d in r.structured_content["gpus"] for h in d["holders"]}
            check(set(workers) <= found, f"orphaned workers {workers} not all found in {found}")
            check(r.structured_content["clean"] is False, "diagnose says clean")
            await refused(s, "run", {"command": ["true"]}, "run", allows="read-only + clean")

            r = await call(s, "clean", {"timeout": 30, "grace": 2}, progress_callback=on_progress)
            c = r.structured_content
            check(c["clean"] is True, f"not clean: {r.content[0].text}")
            check(set(workers) <= set(c["kill"]["signalled"]), f"workers not all stopped: {c['kill']}")
            check(all(d["verdict"] == "clean" and d["mem_used_mib"] == 0 for d in c["gpus"]), f"after: {c['gpus']}")
            check(progress, "clean sent no progress notification")

            r = await call(s, "gpus")
            check(all(g["mem_used_mib"] == 0 for g in r.structured_content["gpus"]), "memory still used")
            r = await call(s, "diagnose")
            check(r.structured_content["clean"] is True, r.content[0].text)
            for p in workers:
                check(not alive(p), f"worker {p} still alive")
            for p in keep:
                check(alive(p), f"daemon/observer {p} was stopped")

    e = [e for e in journal() if e["tool"] == "clean"][-1]
    check(e["result"] == "ok" and set(workers) <= set(e["signalled"]), f"journal: {e}")
    # Each signal of the call is journaled with the call that sent it.
    sent = [r for r in records() if r["kind"] == "signal"]
    check(set(workers) <= {r["target"]["pid"] for r in sent}, f"signals journaled: {sent}")
    for r in sent:
        check(r["front_end"] == "mcp" and r["call"]["tool"] == "clean", f"signal record: {r}")
        check(r["outcome"] == "delivered" and r["why"] and r["target"]["start"] > 0, f"signal record: {r}")
    print(f"  verified: 8 GPUs at 0 MiB, {len(e['signalled'])} pids stopped, daemon and nvidia-smi left alone")


async def cancel_and_run():
    """run_recipe cleans a GPU; a cancelled wait_clean and a cancelled run stop what they
    started; run's result and its no-orphan guarantee; protected daemons survive kill even
    with force."""
    pid_dir = PLANTED["dir"]
    async with stdio_client(server()) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()

            # run_recipe runs the built-in clean-node on the GPU an orphan holds, as the first job of
            # this server (its guard, started with that job, is no leftover of it).
            orphan, gpu = PLANTED["orphan"], PLANTED["orphan_gpu"]
            r = await call(s, "run_recipe", {"name": "clean-node", "args": ["--gpus", str(gpu), "--grace", "2"], "timeout": 120})
            c = r.structured_content
            check(c["code"] == 0 and c["ok"] is True, f"run_recipe: {c}")
            after = c["stdout_tail"].split("after:")[-1]
            check(re.search(rf"^\s*{gpu}\s+0\s+\d+(\s+-)?$", after, re.M) and re.search(r"^clean in ", after, re.M), f"recipe output: {c['stdout_tail']}")
            # gpuloop's guards (the server's, the recipe's) are no leftovers of the recipe.
            check(c["leftovers"] == [] and "left running" not in r.content[0].text, f"recipe leftovers: {r.content[0].text} {c['leftovers']}")
            check(await gone_within(orphan, 15), f"the recipe left the orphan {orphan} running")
            r = await call(s, "gpus")
            check(r.structured_content["gpus"][gpu]["mem_used_mib"] == 0, f"GPU {gpu} after the recipe: {r.structured_content}")
            e = [e for e in journal() if e["tool"] == "run_recipe"][-1]
            check(e["result"] == "ok" and e["arguments"]["name"] == "clean-node", f"journal: {e}")

            async def cancelled_after_progress(name, args):
                got = anyio.Event()
                scope = anyio.CancelScope()

                async def on_progress(done, total, message):
                    got.set()

                async def run_call():
                    with scope:
                        await s.call_tool(name, args, progress_callback=on_progress)
                        raise AssertionError(f"{name} finished instead of being cancelled")

                started = time.monotonic()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(run_call)
                    with anyio.fail_after(60):
                        await got.wait()
                    scope.cancel()
                # The journal line is written only once the call's work has returned.
                e = await wait_journal(lambda e: e["tool"] == name and e["result"] == "cancelled", 30, f"for a cancelled {name}")
                took = time.monotonic() - started
                print(f"  {name}: cancelled after its first progress; stopped, journaled in {took:.1f}s")
                return e

            e = await cancelled_after_progress("wait_clean", {"gpus": [0], "timeout": 300})
            check(e["elapsed_ms"] < 200_000, f"wait_clean ran to its timeout: {e}")
            r = await call(s, "gpus")  # the server goes on serving
            check(r.structured_content["gpus"][0]["mem_used_mib"] > 0, "the holder should still hold GPU 0")

            leader, child = os.path.join(pid_dir, "leader"), os.path.join(pid_dir, "child")
            cmd = f"sleep 301 & echo $! > {child}; echo $$ > {leader}; exec sleep 300"
            await cancelled_after_progress("run", {"command": cmd, "timeout": 300})
            for f in (leader, child):
                pid = int(open(f).read())
                check(await gone_within(pid, 15), f"cancelled run left pid {pid} ({f}) running")

            left = os.path.join(pid_dir, "left")
            r = await call(s, "run", {"command": f"sleep 302 & echo $! > {left}; echo hello; echo oops >&2; exit 3", "timeout": 60})
            c = r.structured_content
            check(c["code"] == 3 and c["ok"] is False, f"run: {c}")
            check(c["stdout_tail"] == "hello" and c["stderr_tail"] == "oops", f"tails: {c}")
            pid = int(open(left).read())
            check(pid in c["leftovers"] and await gone_within(pid, 15), f"leftover {pid}: {c['leftovers']}")

            daemon = PLANTED["daemon"]
            r = await call(s, "kill", {"targets": [daemon], "force": True, "grace": 1})
            c = r.structured_content
            check(c["signalled"] == [] and [x["pid"] for x in c["skipped"]] == [daemon], f"daemon kill: {c}")
            check(alive(daemon), "the protected daemon was killed through MCP")
            check("force has no effect" in r.content[0].text, r.content[0].text)
            # The reason tells the model what it can do here: nothing; not "--force".
            why = c["skipped"][0]["reason"]
            check("MCP never stops it" in why and "force: true" not in why, f"daemon reason: {why}")


async def hosts():
    """Started with --host: gpus, holders, diagnose gather from every host (each record with
    its host); the tools that act on one machine are refused, naming the host set."""
    a, b = PLANTED["ma"], PLANTED["mb"]
    async with stdio_client(server()) as (read, write):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            check("ma, mb" in (init.instructions or ""), f"instructions: {init.instructions}")
            r = await call(s, "gpus")
            seen = sorted((g["host"], g["index"]) for g in r.structured_content["gpus"])
            check(seen == [("ma", 0), ("mb", 0), ("mb", 1)], f"gpus: {seen}")
            r = await call(s, "holders")
            seen = sorted((h["host"], h["pid"]) for h in r.structured_content["holders"])
            check(seen == sorted([("ma", a), ("mb", b)]), f"holders: {seen}")
            r = await call(s, "diagnose")
            held = sorted((d["host"], d["gpu"]) for d in r.structured_content["gpus"] if d["verdict"] != "clean")
            check(held == [("ma", 0), ("mb", 1)], f"diagnose: {held}")
            for name, args in [
                ("kill", {"targets": [a], "dry_run": True}),
                ("clean", {"dry_run": True}),
                ("wait_clean", {"timeout": 1}),
                ("run", {"command": "true"}),
            ]:
                await tool_error(s, name, args, "--host (ma,mb)")
    check(alive(a) and alive(b), "a read-only server over hosts stopped a holder")


async def errors_are_results():
    """Bad arguments and a policy refusal come back as tool results with isError and the
    message in the text content a model sees; a dry run stays allowed; an unknown tool stays a
    protocol error."""
    holder = PLANTED["holder"]
    async with stdio_client(server()) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            await tool_error(s, "diagnose", {"gpus": "zero"}, "diagnose: gpus: invalid type", '"zero"')
            await tool_error(s, "holders", {"all": True, "sudo": True}, "unknown field `sudo`")
            await tool_error(s, "wait_clean", {"timeout": "soon"}, "wait_clean: timeout: invalid type")
            await tool_error(s, "kill", {"targets": [{"pid": holder}]}, "kill: targets[0]", "pid and start")
            await tool_error(s, "diagnose", {"gpus": [99]}, "no GPU with index 99")

            await refused(s, "clean", {}, "clean")
            check(alive(holder), "a refused clean signalled the holder")
            r = await call(s, "clean", {"dry_run": True})
            check(r.is_error is False and holder in r.structured_content["would_signal"], f"dry run: {r}")
            check(alive(holder), "a dry run signalled the holder")

            try:
                await s.call_tool("no_such_tool", {})
                raise AssertionError("an unknown tool was answered with a result")
            except MCPError as e:
                check(e.code == -32602 and "no_such_tool" in e.message, f"unknown tool: {e.code} {e.message}")
    cleans = [e for e in journal() if e["tool"] == "clean"]
    check([e["result"] for e in cleans] == ["refused", "ok"], f"journal: {cleans}")
    check("--allow clean" in cleans[0]["summary"], f"journal: {cleans[0]}")


async def output_schemas():
    """Every tool declares an outputSchema whose root is an object, and a normal and an error
    result of each tool validate against it."""
    victim, held = PLANTED["kill"], PLANTED["clean"]
    async with stdio_client(server()) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            tools = (await s.list_tools()).tools
            check({t.name for t in tools} == ALL_TOOLS, f"tools: {[t.name for t in tools]}")
            for t in tools:
                check(t.output_schema and t.output_schema.get("type") == "object", f"{t.name}: outputSchema {t.output_schema}")
                Draft202012Validator.check_schema(t.output_schema)
            # `call` validates each against the tool's outputSchema.
            for name, args in [
                ("gpus", {}),
                ("holders", {"all": True}),
                ("diagnose", {}),
                ("wait_clean", {"gpus": [2], "timeout": 0}),
                ("kill", {"targets": [victim], "grace": 1}),
                ("clean", {"gpus": [1], "dry_run": True}),
                ("clean", {"gpus": [1], "timeout": 30, "grace": 1}),
                ("run", {"command": ["true"]}),
                ("recipes", {}),
                ("run_recipe", {"name": "clean-node", "args": ["--gpus", "2"], "timeout": 120}),
            ]:
                r = await call(s, name, args)
                check(r.is_error is False, f"{name} {args}: {r.content[0].text}")
            check(await gone_within(victim, 15), f"kill left {victim} running")
            check(await gone_within(held, 15), f"clean left {held} running")
            for name in sorted(ALL_TOOLS):
                await tool_error(s, name, {"no_such_argument": 1}, f"{name}: ", "unknown field `no_such_argument`")


async def recipes_from_cwd():
    """run_recipe runs the built-in recipe, never a file of the server's current directory,
    and a path is no recipe."""
    marker = PLANTED["marker"]
    async with stdio_client(server(cwd=PLANTED["cwd"])) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            r = await call(s, "run_recipe", {"name": "clean-node", "args": ["--timeout", "1"], "timeout": 120})
            c = r.structured_content
            check(c["code"] == 0 and "clean in" in c["stdout_tail"], f"run_recipe clean-node: {c}")
            for name in ["./clean-node", "clean-node.rhai", "../hostile-cwd/clean-node", "/bin/true"]:
                await tool_error(s, "run_recipe", {"name": name}, "no recipe")
    check(not os.path.exists(marker), "run_recipe ran a file of the server's current directory")


async def recipe_args():
    """run_recipe's schema lists each recipe's declared arguments; arguments by name run the
    recipe, a bad one is an error result before anything runs; the user's own recipes run only
    on a server started with --user-recipes."""
    held, keep = PLANTED["held"], PLANTED["keep"]
    async with stdio_client(server()) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            tools = {t.name: t for t in (await s.list_tools()).tools}
            schema = tools["run_recipe"].input_schema
            Draft202012Validator.check_schema(schema)
            names = schema["properties"]["name"]["enum"]
            check("clean-node" in names and "site-hello" in names, f"names: {names}")
            check("mine" not in names, f"a user recipe without --user-recipes: {names}")
            by_title = {b.get("title"): b for b in schema["properties"]["args"]["anyOf"]}
            cn = by_title["clean-node"]["properties"]
            check(cn["timeout"]["type"] == "number" and cn["timeout"]["default"] == 30, f"clean-node timeout: {cn}")
            check(cn["gpu"]["type"] == "array" and cn["allow_reset"]["type"] == "boolean", f"clean-node: {cn}")
            check(by_title["clean-node"]["additionalProperties"] is False, "extra args allowed")
            # Valid calls validate against the schema.
            Draft202012Validator(schema).validate({"name": "clean-node", "args": {"gpu": ["1"], "timeout": 5}})
            r = await call(s, "run_recipe", {"name": "clean-node", "args": {"gpu": ["1"], "timeout": 5, "grace": 1}, "timeout": 120})
            c = r.structured_content
            check(c["code"] == 0 and "clean in" in c["stdout_tail"], f"clean-node by name: {c}")
            check(await gone_within(held, 15), f"clean-node left {held}")
            # Bad arguments: refused before anything runs (the holder of GPU 0 stays).
            for args, says in [
                ({"timeout": "soon"}, 'clean-node: --timeout "soon" is not seconds'),
                ({"tmeout": 3}, 'clean-node: unknown argument "tmeout"'),
                (["--gpu", "0", "--bogus"], "clean-node: unknown argument --bogus"),
                ({"gpu": ["0"], "allow_reset": "yes"}, "allow_reset: \"yes\" is not true or false"),
            ]:
                await tool_error(s, "run_recipe", {"name": "clean-node", "args": args}, says)
            check(alive(keep), "a refused call stopped the holder of GPU 0")
            r = await call(s, "run_recipe", {"name": "site-hello", "args": {"who": "model"}})
            check("hello model from the site" in r.structured_content["stdout_tail"], f"site-hello: {r.structured_content}")
            await tool_error(s, "run_recipe", {"name": "mine"}, "--user-recipes")
            # The user's `site-hello` would shadow the site's for a person; not for this server.
            r = await call(s, "run_recipe", {"name": "site-hello", "args": ["--who", "x"]})
            check("from the site" in r.structured_content["stdout_tail"], f"{r.structured_content}")
    async with stdio_client(server(SERVER_ARGS + ["--user-recipes"])) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            tools = {t.name: t for t in (await s.list_tools()).tools}
            check("mine" in tools["run_recipe"].input_schema["properties"]["name"]["enum"], "no mine with --user-recipes")
            r = await call(s, "run_recipe", {"name": "mine"})
            check("mine ran" in r.structured_content["stdout_tail"], f"mine: {r.structured_content}")
            r = await call(s, "run_recipe", {"name": "site-hello", "args": ["--who", "x"]})
            check("from the user" in r.structured_content["stdout_tail"], f"{r.structured_content}")


async def recipe_needs():
    """A recipe served over MCP does no more than the server allows: one whose header needs
    what the server does not allow is refused before it runs (patch-and-rerun's command is
    the model's data, never run without `--allow run`), and one that does more than its header
    declares is stopped at that call, in the gpuloop that runs it."""
    marker, holder = PLANTED["marker"], PLANTED["holder"]
    touch = ["touch", marker]
    async with stdio_client(server()) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            r = await call(s, "recipes")
            needs = {x["name"]: x["needs"] for x in r.structured_content["recipes"]}
            check(needs["clean-node"] == ["clean"], f"clean-node needs: {needs}")
            check(needs["patch-and-rerun"] == ["clean", "run"], f"patch-and-rerun needs: {needs}")
            check(needs["undeclared"] is None, f"undeclared needs: {needs}")
            peek = [x for x in r.structured_content["recipes"] if x["name"] == "peek"]
            check(len(peek) == 1 and peek[0]["purpose"] == "" and "is a symbolic link" in (peek[0]["refused"] or ""), f"peek: {peek}")
            check("SECRET" not in json.dumps(r.structured_content) and "SECRET" not in r.content[0].text, "a refused recipe was read")
            await refused(s, "run_recipe", {"name": "patch-and-rerun", "args": {"gpu": ["1"], "attempts": 1, "command": touch}}, "run", "read-only + recipes")
            await refused(s, "run_recipe", {"name": "clean-node", "args": {"gpu": ["0"], "grace": 0}}, "clean", "read-only + recipes")
            check(alive(holder), "a refused clean-node stopped the holder")
            # Declares nothing: over MCP it may only read.
            r = await call(s, "run_recipe", {"name": "undeclared"})
            c = r.structured_content
            check(c["code"] != 0 and "run() runs a command or writes a file, which this recipe may not do" in c["stderr_tail"], f"undeclared: {c}")
            r = await call(s, "run_recipe", {"name": "quiet-killer"})
            c = r.structured_content
            check(c["code"] != 0 and "kill() signals processes, which this recipe may not do" in c["stderr_tail"], f"quiet-killer: {c}")
            check(alive(holder), "a recipe declaring needs: none stopped the holder")
    check(not os.path.exists(marker), "a command ran without --allow run")
    async with stdio_client(server(SERVER_ARGS[:-1] + ["recipes,clean"])) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            # Its header says clean; its body runs a command: stopped at run().
            r = await call(s, "run_recipe", {"name": "liar"})
            c = r.structured_content
            check(c["code"] != 0 and "`// needs: clean`" in c["stderr_tail"], f"liar: {c}")
            await refused(s, "run_recipe", {"name": "patch-and-rerun", "args": {"gpu": ["1"], "attempts": 1, "command": touch}}, "run", "read-only + clean, recipes")
    check(not os.path.exists(marker), "a command ran without --allow run")
    async with stdio_client(server(SERVER_ARGS[:-1] + ["recipes,clean,run"])) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            r = await call(s, "run_recipe", {"name": "patch-and-rerun", "args": {"gpu": ["1"], "attempts": 1, "command": touch}, "timeout": 120})
            check(r.structured_content["code"] == 0, f"patch-and-rerun with --allow run: {r.structured_content}")
    check(os.path.exists(marker), "patch-and-rerun did not run its command with --allow run")


SCENARIOS = {
    "recipe_needs": recipe_needs,
    "recipe_args": recipe_args,
    "recipes_from_cwd": recipes_from_cwd,
    "read_only": read_only,
    "done_when": done_when,
    "cancel_and_run": cancel_and_run,
    "hosts": hosts,
    "errors_are_results": errors_are_results,
    "output_schemas": output_schemas,
}

if __name__ == "__main__":
    anyio.run(SCENARIOS[sys.argv[1]])
    print(f"ok: {sys.argv[1]}")
