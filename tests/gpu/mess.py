"""Builds the messes crashed GPU jobs leave behind, with real CUDA allocations (PyTorch).

    python3 mess.py MODE [--gb N] [--gpus 0,1]

Prints one line `READY <json>` once every process holds its memory, with the pids of what it
started, then keeps running (the launcher sleeps) until killed. Modes:
  plain       one process holding N GB on the first GPU
  fork        a process that allocates, forks a child inheriting the CUDA handles, then exits
  mp          torch.multiprocessing: a launcher and one worker per GPU (each holding N GB)
  observer    an NVML-only client (pynvml): opens /dev/nvidia*, maps nothing
  ignore-term a holder that ignores SIGTERM
  slow-term   a holder whose SIGTERM handler takes 3 s to exit
  stopped     a holder stopped with SIGSTOP
  ipc         a CUDA IPC exporter and an importer of its tensor
  ddp         torch.distributed NCCL ranks (one per GPU) under a launcher
  vllm        an API process, an engine-core child, one setsid worker per GPU
  torchrun-worker  a worker under real torchrun: holds N GB on its LOCAL_RANK's GPU, prints
              READY with its pid (torchrun passes worker stdout through)
  dataloader  a rank holding N GB whose forked DataLoader workers (fork after CUDA init, as
              num_workers>0 does on Linux) are busy in __getitem__ and keep its context
  defunct-leader  a CUDA context held by a non-main thread; the main thread then SYS_exits,
              leaving a zombie leader (State Z, Threads > 1, empty /proc/PID/fd) that holds
              the memory through its live thread
"""
import json, os, signal, sys, time

MODE, GB, GPUS = None, 10.0, None


def parse_args():
    global MODE, GB, GPUS
    MODE = sys.argv[1]
    args = sys.argv[2:]
    while args:
        a = args.pop(0)
        if a == "--gb":
            GB = float(args.pop(0))
        elif a == "--gpus":
            GPUS = [int(x) for x in args.pop(0).split(",")]


def ready(**info):
    sys.stdout.write("READY " + json.dumps(info) + "\n")
    sys.stdout.flush()


def hold(dev, gb=None):
    import torch
    n = int((GB if gb is None else gb) * 1e9)
    x = torch.empty(n, dtype=torch.uint8, device=f"cuda:{dev}")
    x.fill_(1)
    torch.cuda.synchronize(dev)
    return x


def sleep_forever():
    while True:
        time.sleep(3600)


def gpus():
    if GPUS is not None:
        return GPUS
    import torch
    return list(range(torch.cuda.device_count()))


def pipe_child(fn):
    """Forks; the child runs fn(write_end) and sleeps forever; returns the child's pid once it
    wrote its ready byte."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        fn(w)
        sleep_forever()
    os.close(w)
    assert os.read(r, 1) == b"1"
    os.close(r)
    return pid


def worker(dev, q):
    x = hold(dev)
    q.put((dev, os.getpid()))
    sleep_forever()


def rank(r, world, q):
    import torch, torch.distributed as dist
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(r)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29533", rank=r, world_size=world)
    t = torch.ones(1, device="cuda")
    dist.all_reduce(t)
    x = hold(r)
    q.put((r, os.getpid(), float(t.item())))
    sleep_forever()


def set_title(title):
    """As vLLM names its processes (VLLM::EngineCore, VLLM::Worker_TP0): setproctitle where it
    is installed (it rewrites the command line too), else the kernel's comm alone."""
    try:
        import setproctitle
        setproctitle.setproctitle(title)
    except ImportError:
        import ctypes
        ctypes.CDLL(None).prctl(15, title.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def vllm_worker(dev, q):
    os.setsid()
    set_title(f"VLLM::Worker_TP{dev}")
    x = hold(dev)
    q.put(("worker", os.getpid(), dev))
    sleep_forever()


def engine_core(q):
    set_title("VLLM::EngineCore")
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    ps = [ctx.Process(target=vllm_worker, args=(d, q)) for d in gpus()]
    for p in ps:
        p.start()
    q.put(("engine", os.getpid(), -1))
    sleep_forever()


def ipc_importer(handle_q, q):
    import torch
    t = handle_q.get()
    s = float(t[:16].sum().item())
    q.put(("importer", os.getpid(), s))
    sleep_forever()


def main():
    # Spawned children (torch.multiprocessing) re-import this file: only the launcher parses
    # arguments and dispatches.
    parse_args()
    if MODE == "plain":
        x = hold(gpus()[0])
        ready(pids=[os.getpid()])
        sleep_forever()
    elif MODE in ("ignore-term", "slow-term", "stopped"):
        if MODE == "ignore-term":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if MODE == "slow-term":
            def slow(*_):
                time.sleep(3)
                os._exit(0)
            signal.signal(signal.SIGTERM, slow)
        x = hold(gpus()[0])
        ready(pids=[os.getpid()])
        if MODE == "stopped":
            os.kill(os.getpid(), signal.SIGSTOP)
        sleep_forever()
    elif MODE == "fork":
        x = hold(gpus()[0])
        child = pipe_child(lambda w: os.write(w, b"1"))
        ready(pids=[os.getpid(), child], creator=os.getpid(), child=child)
        os._exit(0)
    elif MODE == "torchrun-worker":
        x = hold(int(os.environ.get("LOCAL_RANK", "0")))
        ready(pids=[os.getpid()], restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
        sleep_forever()
    elif MODE == "dataloader":
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Slow(Dataset):
            # The first batch comes back; the workers then sit in __getitem__ (a slow
            # reader, a hung file system) and never look at their parent's watchdog.
            def __len__(self):
                return 1000

            def __getitem__(self, i):
                if i >= 4:
                    sleep_forever()
                return i

        x = hold(gpus()[0])
        loader = DataLoader(Slow(), batch_size=2, num_workers=2, multiprocessing_context="fork")
        it = iter(loader)
        next(it)
        workers = [w.pid for w in it._workers]
        ready(rank=os.getpid(), pids=[os.getpid()] + workers, workers=workers)
        sleep_forever()
    elif MODE == "defunct-leader":
        import ctypes, threading
        held = threading.Event()

        def keep():
            x = hold(gpus()[0])
            held.set()
            sleep_forever()

        threading.Thread(target=keep, daemon=False).start()
        held.wait(120)
        ready(pids=[os.getpid()])
        # SYS_exit (60 on x86_64, 93 on arm64) ends only the main thread.
        nr = 93 if os.uname().machine in ("aarch64", "arm64") else 60
        ctypes.CDLL(None, use_errno=True).syscall(nr, 0)
    elif MODE == "observer":
        import pynvml
        pynvml.nvmlInit()
        ready(pids=[os.getpid()])
        sleep_forever()
    elif MODE in ("mp", "ddp", "vllm", "ipc"):
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        if MODE == "mp":
            ps = [ctx.Process(target=worker, args=(d, q)) for d in gpus()]
            for p in ps:
                p.start()
            got = [q.get(timeout=60) for _ in ps]
            ready(launcher=os.getpid(), pids=[os.getpid()] + [p for _, p in got])
        elif MODE == "ddp":
            world = len(gpus())
            ps = [ctx.Process(target=rank, args=(r, world, q)) for r in range(world)]
            for p in ps:
                p.start()
            got = [q.get(timeout=90) for _ in ps]
            ready(launcher=os.getpid(), pids=[os.getpid()] + [g[1] for g in got], allreduce=[g[2] for g in got])
        elif MODE == "vllm":
            core = ctx.Process(target=engine_core, args=(q,))
            core.start()
            got = [q.get(timeout=90) for _ in range(len(gpus()) + 1)]
            ready(api=os.getpid(), pids=[os.getpid()] + [g[1] for g in got])
        elif MODE == "ipc":
            import torch
            x = hold(gpus()[0])
            hq = ctx.Queue()
            imp = ctx.Process(target=ipc_importer, args=(hq, q))
            imp.start()
            hq.put(x)
            got = q.get(timeout=60)
            ready(exporter=os.getpid(), importer=got[1], pids=[os.getpid(), got[1]], checksum=got[2])
        sleep_forever()
    else:
        sys.exit(f"unknown mode {MODE}")


if __name__ == "__main__":
    main()
