"""The keys and sshd_config of a private OpenSSH server on 127.0.0.1 for the several-hosts
benchmarks (hosts.py, fleet.py): throw-away host and client keys, the client key authorised,
the host key known under `alias`, and an sshd that accepts the simulator's variables."""
import shutil, subprocess


def write(tmp, alias, keygen="ssh-keygen", accept=()):
    """`accept`: more variables the server takes from a client's SetEnv."""
    for k in ("host_key", "id"):
        subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", f"{tmp}/{k}"], check=True)
    shutil.copy(f"{tmp}/id.pub", f"{tmp}/authorized_keys")
    with open(f"{tmp}/host_key.pub") as f:
        key = " ".join(f.read().split()[:2])
    with open(f"{tmp}/known_hosts", "w") as f:
        f.write(f"{alias} {key}\n")
    with open(f"{tmp}/sshd_config", "w") as f:
        f.write(f"""ListenAddress 127.0.0.1
HostKey {tmp}/host_key
PidFile {tmp}/sshd.pid
AuthorizedKeysFile {tmp}/authorized_keys
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
AcceptEnv GPULOOP_SIM GPULOOP_SIM_DIR{''.join(' ' + v for v in accept)}
MaxStartups 256
MaxSessions 256
LogLevel ERROR
# bash sources ~/.bashrc for a command sshd starts unless SHLVL says it is nested; a machine's
# `pyenv init` there costs ~0.3 s a session. Every tool measured goes through this sshd alike.
SetEnv SHLVL=1
""")


def host(alias, port, user, tmp, key_alias, setenv=""):
    """One alias of the client config: 127.0.0.1:port as `user` with the throw-away key,
    the host key checked under `key_alias`, and `setenv` (`A=1 B=2`) sent to the server."""
    return f"""Host {alias}
  HostName 127.0.0.1
  Port {port}
  User {user}
  IdentityFile {tmp}/id
  IdentitiesOnly yes
  UserKnownHostsFile {tmp}/known_hosts
  GlobalKnownHostsFile /dev/null
  HostKeyAlias {key_alias}
  StrictHostKeyChecking yes
  LogLevel ERROR
""" + (f"  SetEnv {setenv}\n" if setenv else "")
