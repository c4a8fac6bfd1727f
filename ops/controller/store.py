"""The controller's objects in GCS (its bucket: the platform's artifacts bucket).

    controller/manifests/<stack>.json   each stack's desired state (manifest.py); a team
                                        stack's is in its own artifacts bucket, where
                                        its platform's manifest (teamManifests) says
    controller/lease/<slot>.json        the lease of one interval slot: create-only
    controller/moves.json               moves in flight (plan.py Move)
    controller/audit/<run id>.json      every run's steps, each with reason and outcome
    controller/last-run.json            the newest run's audit (tpuctl status)
    budget-stop/<team>/...              the budget stop's markers (model/budget_hold.py)

The lease: a run acts only if it creates the object of the current slot
(`floor(now / interval)`) with ifGenerationMatch=0, which GCS grants to one caller
only, answering every other 412 Precondition Failed (cloud.google.com/storage/docs/
request-preconditions), and no neighbouring slot's object is held (unreleased and
unexpired). It expires one interval after it was taken; a run stops starting steps a
margin before then and releases it when done, so two runs never act at once, and a
killed run's lease ends by itself (the next run finishes its work: plan.py move_steps).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from model.budget_hold import MARKER_PREFIX
from model.manifest import PREFIX as MANIFEST_PREFIX
from model.manifest import Manifest, ManifestError, TeamManifestRef, parse
from ops.controller.plan import Move

LEASE_PREFIX = "controller/lease/"
MOVES = "controller/moves.json"
AUDIT_PREFIX = "controller/audit/"
LAST_RUN = "controller/last-run.json"


@dataclass(frozen=True)
class Lease:
    name: str
    expires: datetime

    def left(self, now: datetime) -> float:
        return (self.expires - now).total_seconds()


class Store:
    """The controller's bucket through google-cloud-storage (`client`: a storage.Client)."""

    def __init__(self, client: Any, bucket: str) -> None:
        self.client = client
        self.bucket_name = bucket
        self.bucket = client.bucket(bucket)

    # ---- reading -------------------------------------------------------------------
    def manifests(self) -> tuple[list[Manifest], list[str]]:
        """Every stack's manifest, the team stacks' its platforms' name included, and one
        problem per object that is not one (or cannot be read): never a crash, and the
        other stacks are reconciled."""
        found, problems = [], []
        for blob in self.client.list_blobs(self.bucket_name, prefix=MANIFEST_PREFIX):
            try:
                found.append(parse(blob.download_as_text(), f"gs://{self.bucket_name}/"
                                                            f"{blob.name}"))
            except ManifestError as error:
                problems.append(str(error))
        refs = {(r.bucket, r.object): r for m in found for r in m.team_manifests}
        for ref in refs.values():
            try:
                found.append(self.team_manifest(ref))
            except ManifestError as error:
                problems.append(str(error))
        return found, problems

    def team_manifest(self, ref: TeamManifestRef) -> Manifest:
        """A team stack's manifest, read where its platform's says, and held to what the
        platform lets that team run: its stack, its team's nodes in its team's project;
        its own budgetTeams and teamManifests are not its to give."""
        from google.api_core import exceptions as gexc

        try:
            text = self.client.bucket(ref.bucket).blob(ref.object).download_as_text()
        except gexc.NotFound:
            raise ManifestError(f"{ref.uri}: no manifest of team {ref.team}'s stack "
                                f"{ref.stack} (no team stack, or its `pulumi up` has not "
                                f"run since the controller was enabled)") from None
        except Exception as error:  # denied, unreachable: a problem line, never a crash
            raise ManifestError(f"{ref.uri}: team {ref.team}'s manifest not read "
                                f"({type(error).__name__}: {error})") from None
        manifest = parse(text, ref.uri)
        target = manifest.target
        strays = [n.node_id for n in target.nodes
                  if n.project != ref.project or n.team != ref.team]
        if target.stack != ref.stack or strays:
            raise ManifestError(f"{ref.uri}: not team {ref.team}'s to give: stack "
                                f"{target.stack!r} (expected {ref.stack!r}), nodes outside "
                                f"team {ref.team} in {ref.project}: {', '.join(strays) or 'none'}")
        return replace(manifest, budget_teams=(), team_manifests=())

    def marker_names(self) -> list[str]:
        return [b.name for b in self.client.list_blobs(self.bucket_name, prefix=MARKER_PREFIX)]

    def moves(self) -> list[Move]:
        body = self._json(MOVES) or {}
        return [Move.from_json(m) for m in body.get("moves", [])]

    def last_run(self) -> dict[str, Any] | None:
        return self._json(LAST_RUN)

    def _json(self, name: str) -> Any:
        from google.api_core import exceptions as gexc

        try:
            return json.loads(self.bucket.blob(name).download_as_text())
        except gexc.NotFound:
            return None

    # ---- writing -------------------------------------------------------------------
    def try_lease(self, run_id: str, now: datetime, seconds: float) -> Lease | None:
        """The lease for one interval from `now` if this run may act, else None.

        The run creates its slot's object (`floor(now / seconds)`) with
        ifGenerationMatch=0: of runs in one slot, one creates it. A run across a slot
        boundary from another sees the neighbour's object, unreleased and unexpired,
        before or after creating its own, and stands down: at most one acts."""
        from google.api_core import exceptions as gexc

        slot = int(now.timestamp() // seconds)
        if self._active(slot - 1, now):
            return None
        expires = now + timedelta(seconds=seconds)
        name = f"{LEASE_PREFIX}{slot}.json"
        record = {"run": run_id, "taken": now.isoformat(), "expires": expires.isoformat()}
        try:
            self.bucket.blob(name).upload_from_string(
                json.dumps(record), content_type="application/json", if_generation_match=0)
        except gexc.PreconditionFailed:
            return None
        lease = Lease(name, expires)
        if self._active(slot - 1, now) or self._active(slot + 1, now):
            self.release(lease)
            return None
        return lease

    def _active(self, slot: int, now: datetime) -> bool:
        record = self._json(f"{LEASE_PREFIX}{slot}.json")
        if not record or record.get("released"):
            return False
        return datetime.fromisoformat(record["expires"]) > now

    def release(self, lease: Lease) -> None:
        """The run is over: its slot's object says so (the run holds it: a plain write)."""
        self._write(lease.name, {"released": True})

    def save_moves(self, moves: list[Move]) -> None:
        self._write(MOVES, {"moves": [m.to_json() for m in moves]})

    def write_audit(self, record: Mapping[str, Any]) -> str:
        name = f"{AUDIT_PREFIX}{record['run']}.json"
        self._write(name, record)
        self._write(LAST_RUN, record)
        return name

    def write_manifest(self, stack: str, text: str) -> None:
        self.bucket.blob(f"{MANIFEST_PREFIX}{stack}.json").upload_from_string(
            text, content_type="application/json")

    def _write(self, name: str, body: Mapping[str, Any]) -> None:
        self.bucket.blob(name).upload_from_string(json.dumps(body, indent=1, default=str),
                                                  content_type="application/json")


def run_id(now: datetime) -> str:
    return now.strftime("%Y%m%dT%H%M%S.%fZ")


def age(record: Mapping[str, Any], now: datetime) -> timedelta | None:
    try:
        return now - datetime.fromisoformat(str(record["finished"]))
    except (KeyError, ValueError):
        return None
