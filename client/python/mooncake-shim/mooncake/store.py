"""`from mooncake.store import MooncakeDistributedStore` served by Crescent."""

from crescent.store import *  # noqa: F401,F403
from crescent.store import __all__  # noqa: F401
from crescent.store import (  # noqa: F401 - Mooncake's structured_object_store reads these
    _deserialize_tensor,
    _serialize_tensor,
    _tensor_metadata_size,
)
