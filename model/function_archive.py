"""A Cloud Run function's source archive, the same bytes on every machine for the same
content: members sorted, one fixed time, one mode (so its digest names the object and a
changed file redeploys the function, as components/budget_stop.py and controller.py do)."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Mapping

_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip entry can carry


def zip_members(members: Mapping[str, bytes]) -> bytes:
    """The archive of `members` (path in the archive -> content)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(members):
            info = zipfile.ZipInfo(name, _ZIP_TIME)
            info.external_attr = 0o644 << 16
            archive.writestr(info, members[name], zipfile.ZIP_DEFLATED)
    return buffer.getvalue()
