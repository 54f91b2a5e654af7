"""`mooncake.mooncake_config`: Mooncake's client configuration object.

`MooncakeConfig` holds `setup()`'s arguments. `load_from_env()` reads the
JSON file named by MOONCAKE_CONFIG_PATH, or else the MOONCAKE_* variables
(MOONCAKE_MASTER required). Sizes take a number of bytes or text such as
"4gb" (1024-based). Crescent's `setup()` reads the same file and variables
itself; this module is for code that builds the arguments first.
"""

import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Optional, Union

logger = logging.getLogger(__name__)

DEFAULT_GLOBAL_SEGMENT_SIZE = 3355443200  # 3.125 GiB
DEFAULT_LOCAL_BUFFER_SIZE = 1073741824  # 1 GiB

# Longest first, so "4kb" is read as kilobytes, not as "4k" + "b".
_SIZE_SUFFIXES = (
    ("kb", 1 << 10),
    ("mb", 1 << 20),
    ("gb", 1 << 30),
    ("tb", 1 << 40),
    ("k", 1 << 10),
    ("m", 1 << 20),
    ("g", 1 << 30),
    ("t", 1 << 40),
    ("b", 1),
)

_KNOWN_PROTOCOLS = frozenset(
    {
        "tcp",
        "rdma",
        "efa",
        "nvmeof",
        "nvlink",
        "musa",
        "nvlink_intra",
        "hip",
        "barex",
        "cxl",
        "ascend",
        "ub",
        "ubshmem",
        "maca",
        "sunrise_link",
        "rpc_only",
    }
)

_REQUIRED_NON_EMPTY_FIELDS = ("local_hostname", "metadata_server", "master_server_address")

_TRUE = frozenset({"true", "1", "yes", "on", "enable"})
_FALSE = frozenset({"false", "0", "no", "off", "disable"})


def _parse_segment_size(value: Union[int, float, str]) -> int:
    """Bytes from an int, a float (truncated) or text like "512mb"."""
    if isinstance(value, (int, float)):
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"size must be a number or text, not {type(value).__name__}")
    text = value.strip().lower()
    if not text:
        raise ValueError("size is empty")
    for suffix, multiplier in _SIZE_SUFFIXES:
        if text.endswith(suffix):
            number = text[: -len(suffix)].strip()
            if not number:
                raise ValueError(f"size {value!r} has a unit and no number")
            return int(float(number) * multiplier)
    return int(float(text))


def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    if value is None:
        return False
    text = str(value).strip().lower()
    if not text:
        return False
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"not a boolean: {value!r}")


@dataclass
class MooncakeConfig:
    local_hostname: str
    metadata_server: str
    global_segment_size: int
    local_buffer_size: int
    protocol: str
    device_name: Optional[str]
    master_server_address: str
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    tenant_id: str = "default"
    enable_client_http_server: bool = False
    client_http_port: int = 9300

    def __post_init__(self) -> None:
        if not isinstance(self.protocol, str) or not self.protocol.strip():
            raise ValueError(f"Invalid protocol: {self.protocol!r}")
        self.protocol = self.protocol.strip().lower()
        if self.protocol not in _KNOWN_PROTOCOLS:
            logger.warning("Unrecognised protocol %r; passing it on as given", self.protocol)
        for name in ("global_segment_size", "local_buffer_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        for name in _REQUIRED_NON_EMPTY_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")

    @staticmethod
    def from_file(file_path: str) -> "MooncakeConfig":
        """The configuration in a JSON file (Mooncake's keys)."""
        with open(file_path) as f:
            config = json.load(f)
        for name in _REQUIRED_NON_EMPTY_FIELDS:
            if name not in config:
                raise ValueError(f"Missing required config field: {name}")
        ssd_path = config.get("ssd_offload_path")
        tenant = config.get("tenant_id")
        return MooncakeConfig(
            local_hostname=config["local_hostname"],
            metadata_server=config["metadata_server"],
            global_segment_size=_parse_segment_size(
                config.get("global_segment_size", DEFAULT_GLOBAL_SEGMENT_SIZE)
            ),
            local_buffer_size=_parse_segment_size(
                config.get("local_buffer_size", DEFAULT_LOCAL_BUFFER_SIZE)
            ),
            protocol=config.get("protocol", "tcp"),
            device_name=config.get("device_name", ""),
            master_server_address=config["master_server_address"],
            enable_ssd_offload=_parse_bool(config.get("enable_ssd_offload", False)),
            ssd_offload_path="" if ssd_path is None else ssd_path,
            tenant_id="default" if tenant is None else tenant,
            enable_client_http_server=_parse_bool(config.get("enable_client_http_server", False)),
            client_http_port=int(config.get("client_http_port", 9300)),
        )

    @staticmethod
    def load_from_env() -> "MooncakeConfig":
        """MOONCAKE_CONFIG_PATH's file if set, else the MOONCAKE_* variables."""
        path = os.getenv("MOONCAKE_CONFIG_PATH")
        if path:
            return MooncakeConfig.from_file(path)
        master = os.getenv("MOONCAKE_MASTER")
        if not master:
            raise ValueError(
                "Neither the environment variable 'MOONCAKE_CONFIG_PATH' nor 'MOONCAKE_MASTER' is set."
            )
        env = os.getenv
        return MooncakeConfig(
            local_hostname=env("MOONCAKE_LOCAL_HOSTNAME", "localhost"),
            metadata_server=env("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
            global_segment_size=_parse_segment_size(
                env("MOONCAKE_GLOBAL_SEGMENT_SIZE", str(DEFAULT_GLOBAL_SEGMENT_SIZE))
            ),
            local_buffer_size=_parse_segment_size(
                env("MOONCAKE_LOCAL_BUFFER_SIZE", str(DEFAULT_LOCAL_BUFFER_SIZE))
            ),
            protocol=env("MOONCAKE_PROTOCOL", "tcp"),
            device_name=env("MOONCAKE_DEVICE", ""),
            master_server_address=master,
            enable_ssd_offload=_parse_bool(env("MOONCAKE_OFFLOAD_ENABLED", "false")),
            ssd_offload_path=env("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", ""),
            tenant_id=env("MOONCAKE_TENANT_ID", "default"),
            enable_client_http_server=_parse_bool(
                env("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", "false")
            ),
            client_http_port=int(env("MOONCAKE_CLIENT_HTTP_PORT", "9300")),
        )
