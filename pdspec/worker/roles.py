"""The P/D roles, from their packages: `ROLES["prefill"]`, `ROLES["decode"]`."""

from __future__ import annotations

from decode_worker.role import ROLE as DECODE
from pdspec.worker.role_spec import RoleSpec
from prefill_worker.role import ROLE as PREFILL

ROLES: dict[str, RoleSpec] = {spec.name: spec for spec in (PREFILL, DECODE)}
