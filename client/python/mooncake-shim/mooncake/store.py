"""`from mooncake.store import MooncakeDistributedStore` served by Crescent."""

from crescent.store import *  # noqa: F401,F403
from crescent.store import __all__  # noqa: F401
