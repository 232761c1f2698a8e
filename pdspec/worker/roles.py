"""The P/D roles, from their packages: `ROLES["prefill"]`, `ROLES["decode"]`, and the engine
features each has (`ROLE_FEATURES`: only those are reported by that role's worker, so a
decode worker never shows a prefill-only feature as off)."""

from __future__ import annotations

from decode_worker import role as decode_role
from pdspec.worker.role_spec import RoleSpec
from prefill_worker import role as prefill_role

ROLES: dict[str, RoleSpec] = {spec.name: spec for spec in map(RoleSpec.from_module, (prefill_role, decode_role))}
ROLE_FEATURES: dict[str, tuple[str, ...]] = {name: spec.features for name, spec in ROLES.items()}
