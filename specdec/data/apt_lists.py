"""Fetching Debian package lists with apt-get into a private folder, the system's apt state untouched.

The corpus builders (`corpora.fetch_lists`, `distill_pool.fetch_pool_lists`) read the package and translation lists
that `apt-get update` downloads. Both run it the same way: a private APT_CONFIG (`write_config`: its own lists and
cache folders, an empty Dir::Etc::Parts so no apt.conf.d setting applies, the languages asked for), the system's
network settings (proxies, timeouts) passed on as -o options and never written to disk (`forwarded_options`), as
root, with a one-line error (apt's last lines after it) and the caller's remedy when anything fails (`run_update`).
"""

import os
import re
import shutil
import subprocess
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from specdec import fileio

# Environment variable naming the apt-get binary (tests point it elsewhere).
APT_GET_ENV = "SPECDEC_APT_GET"

# System apt settings carried over to the private configuration (which
# replaces apt.conf.d); passed as -o options so they are never written to disk.
_FORWARD_KEYS = re.compile(
    r"^Acquire::(Check-Valid-Until|Check-Date|Retries|"
    r"(https?|ftp)::(Proxy|Timeout)(::[^\s]+)?)$")

Log = Callable[[str], None]


def _no_log(_: str) -> None:
  pass


def _with_remedy(message: str, remedy: str) -> str:
  return f"{message} {remedy}" if remedy else message


def resolve_apt_get(apt_get: Optional[str] = None, remedy: str = "") -> str:
  """The path of the apt-get binary (`apt_get`, else $SPECDEC_APT_GET, else `apt-get` on PATH).

  RuntimeError naming what was looked for, and `remedy`, when there is none.
  """
  name = apt_get or os.environ.get(APT_GET_ENV) or "apt-get"
  if os.sep in name:
    path = name if (os.path.isfile(name) and os.access(name, os.X_OK)) else None
  else:
    path = shutil.which(name)
  if not path:
    raise RuntimeError(_with_remedy(f"apt-get not found (looked for {name!r}).", remedy))
  return path


def require_root(remedy: str = "") -> None:
  """RuntimeError (with `remedy`) unless this process may run `apt-get update` (root)."""
  if hasattr(os, "geteuid") and os.geteuid() != 0:
    raise RuntimeError(_with_remedy(
        f"`apt-get update` needs root (running as uid {os.geteuid()}).", remedy))


def _config_entries(apt_get: str) -> List[Tuple[str, str]]:
  """(key, value) of every line of the system's `apt-config dump` (the one beside `apt_get`); RuntimeError when
  it cannot be read."""
  apt_config = os.path.join(os.path.dirname(apt_get), "apt-config")
  env = dict(os.environ)
  env.pop("APT_CONFIG", None)  # the system's configuration, not a private one
  try:
    out = subprocess.run([apt_config, "dump"], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
  except (OSError, subprocess.SubprocessError) as e:
    raise RuntimeError(f"could not read the system's apt configuration with "
                       f"{apt_config} dump: {e}") from e
  return [m.groups() for m in (re.match(r'^(\S+) "(.*)";$', line) for line in out.splitlines()) if m]


def system_config(apt_get: str) -> Dict[str, str]:
  """The system's apt configuration, {lower-cased key: first value}; RuntimeError when it cannot be read."""
  values = {}
  for key, value in _config_entries(apt_get):
    values.setdefault(key.lower(), value)
  return values


def forwarded_options(apt_get: str) -> List[str]:
  """A few network settings of the system's apt configuration, as -o options ([] where it cannot be read)."""
  if not os.access(os.path.join(os.path.dirname(apt_get), "apt-config"), os.X_OK):
    return []
  try:
    entries = _config_entries(apt_get)
  except RuntimeError:
    return []
  return [arg for key, value in entries if _FORWARD_KEYS.match(key) for arg in ("-o", f"{key}={value}")]


def write_config(apt_dir: str, languages: Sequence[str] = ("en", "de")) -> str:
  """Writes the private apt configuration under `apt_dir`; returns its path."""
  apt_dir = os.path.abspath(apt_dir)
  parts = os.path.join(apt_dir, "parts")
  lists = os.path.join(apt_dir, "lists")
  cache = os.path.join(apt_dir, "cache")
  if os.path.isdir(parts):
    shutil.rmtree(parts)
  os.makedirs(parts)  # empty: the system's apt.conf.d is not read
  os.makedirs(os.path.join(lists, "partial"), exist_ok=True)
  os.makedirs(os.path.join(cache, "archives", "partial"), exist_ok=True)
  langs = " ".join(f'"{lang}";' for lang in languages)
  conf = (f'Dir::Etc::Parts "{parts}";\n'
          f'Dir::State::Lists "{lists}";\n'
          f'Dir::Cache "{cache}";\n'
          f'Acquire::Languages {{ {langs} }};\n'
          'Acquire::GzipIndexes "false";\n')
  path = os.path.join(apt_dir, "apt.conf")
  fileio.atomic_write(path, conf.encode("utf-8"))
  return path


def lists_dir(apt_dir: str) -> str:
  """Where `apt-get update` under `write_config(apt_dir)` puts the lists."""
  return os.path.join(os.path.abspath(apt_dir), "lists")


def run_update(apt_get: str, conf: str, options: Sequence[str] = (), timeout: float = 900,
               log: Log = _no_log, remedy: str = "") -> subprocess.CompletedProcess:
  """Runs `apt-get update` under the private configuration `conf`, with `options` and the forwarded settings.

  RuntimeError when it cannot run or exits non-zero (apt's last 2,000 characters, then `remedy`).
  """
  env = dict(os.environ, APT_CONFIG=conf, LC_ALL="C")
  cmd = [apt_get, "update", *options] + forwarded_options(apt_get)
  log(f"running apt-get update with APT_CONFIG={conf}")
  t0 = time.time()
  try:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                          timeout=timeout)
  except (OSError, subprocess.SubprocessError) as e:
    raise RuntimeError(_with_remedy(f"apt-get update failed to run: {e}.", remedy)) from e
  if proc.returncode != 0:
    tail = (proc.stdout + proc.stderr)[-2000:]
    raise RuntimeError(f"apt-get update exited with {proc.returncode}:\n{tail}"
                       + (f"\n{remedy}" if remedy else ""))
  log(f"apt-get update done in {time.time() - t0:.1f}s")
  return proc
