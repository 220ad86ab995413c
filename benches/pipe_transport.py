"""The `pipe` transport of the hosts benches: an `ssh` for gpuloop's PATH that starts the
remote command here, with the alias's own simulated machine, as sshd would there."""
import os


def write_pipe_ssh(tmp):
    """Writes TMP/pipe-bin/ssh: gpuloop's ssh argv ends `-- DEST 'CMD'`; it runs CMD with
    GPULOOP_SIM=8x80G and GPULOOP_SIM_DIR=TMP/sims/DEST. Returns the folder to put on PATH."""
    os.makedirs(f"{tmp}/pipe-bin")
    with open(f"{tmp}/pipe-bin/ssh", "w") as f:
        f.write(f"""#!/bin/sh
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done
shift
GPULOOP_SIM=8x80G GPULOOP_SIM_DIR={tmp}/sims/$1; export GPULOOP_SIM GPULOOP_SIM_DIR
eval "exec $2"
""")
    os.chmod(f"{tmp}/pipe-bin/ssh", 0o755)
    return f"{tmp}/pipe-bin"
