"""`skipdecode bench`, moved whole into this package before it is split one idea a file."""

from .timing import *  # noqa: F401,F403
from .timing import _numbers  # noqa: F401
