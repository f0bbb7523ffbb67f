"""Real shells driving dxi's completion: ``zsh_completes`` types a line and a TAB in an interactive
zsh."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ..conftest import DXI
from .servers import need

ZSH_DRIVER = r"""
# drive an interactive zsh in a pseudo-terminal (zsh/zpty): type $2 and a TAB, then ^X, bound to a widget that
# writes the edited line to $1
zmodload zsh/zpty || exit 3
zpty z zsh -f -i
zpty -w z 'PS1="> "; autoload -U compinit; compinit -u -D'
[[ -n $3 ]] && zpty -w z 'eval "$(dxi completion zsh)"'
zpty -w z 'show() { print -r -- "[$BUFFER]" > '"$1"'; }; zle -N show; bindkey "^X" show'
zpty -w -n z "$2"$'\t\x18'
for i in {1..600}; do [[ -s $1 ]] && break; sleep 0.1; done
zpty -d z
[[ -s $1 ]] || exit 4
"""


def zsh_completes(tmp_path: Path, line: str, load: bool = True) -> str:
    """The command line a real interactive zsh shows after typing ``line`` and TAB, with dxi's
    completion loaded (``eval "$(dxi completion zsh)"``, the installed dxi on PATH) or,
    ``load=False``, without it."""
    out = tmp_path / f"buffer-{len(list(tmp_path.glob('buffer-*')))}"
    env = dict(os.environ, PATH=f"{Path(DXI).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    done = subprocess.run(
        [need("zsh"), "-f", "-c", ZSH_DRIVER, "zsh", str(out), line, "1" if load else ""],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    if done.returncode == 3:
        pytest.skip("zsh has no zsh/zpty module to drive a completion with")
    assert done.returncode == 0, done.stderr
    return out.read_text().rstrip("\n")
