#!/usr/bin/python3
"""torchrun for Debian's torch 1.13 on Python 3.11: /usr/bin/python3 bench/torchrun311.py ARGS is
/usr/bin/torchrun ARGS (note 1.13's spelling: --nproc_per_node, --max_restarts).

Debian's torchrun fails at its first start with "AttributeError: 'NoneType' object has no
attribute 'get'" in elastic/multiprocessing/api.py to_map(). Std.from_str("0"), the parse of the
default --redirects 0 (and of --tee), finds the member by looping over Std; since Python 3.11 a
Flag enum's iteration yields only its one-bit members (OUT, ERR), not NONE (0) or ALL (3), so the
loop falls through and returns None (pytorch/pytorch#92319 tracked the fix for 3.11). This patch
builds the member from the int instead, after the original has validated the string; nothing else
changes.
"""
import sys

from torch.distributed import run
from torch.distributed.elastic.multiprocessing.api import Std

_original_from_str = Std.from_str


def _from_str(cls, text):
    _original_from_str(text)  # raises ValueError for a string that is not "N" or "I:N,..."
    if ":" not in text:
        return cls(int(text))
    return {int(i): cls(int(v)) for i, v in (pair.split(":") for pair in text.split(","))}


Std.from_str = classmethod(_from_str)

if __name__ == "__main__":
    sys.exit(run.main())
