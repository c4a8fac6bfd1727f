#!/usr/bin/env bash
# tpu-stack bootstrap: the node's `startup-script`. It runs at every boot on every
# worker (docs/tpu-facts.md, "On the VM"), writes the agent (a zipapp) beside the
# packages and hands over to it: as a systemd service where systemd runs (restart
# on failure, SIGTERM with a grace period on stop, one instance), else in the
# foreground, exiting with the job's outcome. node_agent.build.startup_script()
# puts the zipapp, base64-encoded, where the marker line below stands.
set -euo pipefail

root=${TPU_STACK_ROOT:-/opt/tpu-stack}
python=${TPU_STACK_PYTHON:-python3}
unit=tpu-stack-agent.service

mkdir -p "$root"
agent_tmp=$(mktemp "$root/.agent.pyz.XXXXXX")
base64 -d > "$agent_tmp" <<'TPU_STACK_AGENT_ZIPAPP'
@AGENT_ZIPAPP_BASE64@
TPU_STACK_AGENT_ZIPAPP
# A different agent.pyz than the one on disk: a running agent hands over to it (below).
# The agent it replaces is kept: a new one that does not start falls back to it
# (node_agent/handover.py).
agent_changed=yes
if cmp -s "$agent_tmp" "$root/agent.pyz"; then agent_changed=no; fi
if [[ $agent_changed == yes && -f $root/agent.pyz ]]; then
  cp -f "$root/agent.pyz" "$root/agent.previous.pyz"
fi
mv -f "$agent_tmp" "$root/agent.pyz"

# TPU_STACK_INIT: auto (default), systemd or foreground. sd_booted(3): systemd
# is PID 1 exactly when /run/systemd/system exists.
init=${TPU_STACK_INIT:-auto}
if [[ $init == auto ]]; then
  if [[ -d /run/systemd/system ]]; then init=systemd; else init=foreground; fi
fi

case $init in
  systemd)
    unit_dir=${TPU_STACK_UNIT_DIR:-/etc/systemd/system}
    python_path=$(command -v "$python")
    cat > "$unit_dir/$unit" <<UNIT
[Unit]
Description=tpu-stack node agent (training package supervisor)
Wants=network-online.target
# Stopped before the image's TPU runtime (tpu-runtime.service, the unit that runs the
# TPU server container on every worker: GoogleCloudPlatform/ml-auto-solutions
# dags/solutions_team/configs/tensorflow/common.py edits /etc/systemd/system/
# tpu-runtime.service). systemd.unit(5): when two units with an ordering dependency
# are shut down, the inverse of the start-up order applies, so After= makes this unit
# stop first and the runtime keep serving a pod's stop save while the agent waits.
# After= alone: no Wants=, so an image without the runtime is not asked to start one.
After=network-online.target tpu-runtime.service
# No start limit: a node that stops restarting sits failed and billed until someone
# reboots it (spot nodes never are). systemd.unit(5): StartLimitIntervalSec=0
# disables rate limiting. The agent itself retries transient failures with
# backoff; systemd only restarts an agent that crashed.
StartLimitIntervalSec=0

[Service]
Environment=TPU_STACK_ROOT=$root
ExecStart=$python_path $root/agent.pyz run --stay
Restart=on-failure
RestartSec=30
# 75/76: stopped on SIGTERM (with or without a stop save), a clean stop.
SuccessExitStatus=75 76
# SIGTERM to the agent only; it stops the job so the job checkpoints, then
# everything left gets SIGKILL after TimeoutStopSec (above the agent's 120 s grace).
KillSignal=SIGTERM
KillMode=mixed
TimeoutStopSec=150
# A new agent.pyz takes over in place: SIGHUP makes the agent exec it, keeping its pid
# (MAINPID), its cgroup and the job (node_agent/handover.py). systemd.service(5),
# ExecReload=: its example is "kill -HUP \$MAINPID".
ExecReload=/bin/kill -HUP \$MAINPID
# The agent feeds systemd's watchdog (sd_notify(3) WATCHDOG=1 to \$NOTIFY_SOCKET, every
# 2 s) while every loop and its main thread are within their bounds; a stuck agent is
# restarted (systemd.service(5), WatchdogSec=: without a keep-alive within the time the
# service "is placed in a failed state", and Restart=on-failure restarts it).
# NotifyAccess=main: only the agent (MAINPID, the same across a hand-over's exec).
WatchdogSec=60
NotifyAccess=main

[Install]
WantedBy=multi-user.target
UNIT
    was_active=no
    if systemctl is-active --quiet "$unit"; then was_active=yes; fi
    systemctl daemon-reload
    # `start` on an active unit does nothing: a rerun never starts a second job.
    systemctl enable --now "$unit"
    # systemd may have started the agent from the disk before this script wrote a new
    # one (a metadata change does not rerun the script either; the agent watches the
    # script for that). An agent that can hand over (it leaves run/agent-handover)
    # execs the new file in place on `reload`, the job kept; an older one is restarted,
    # which stops the job with a checkpoint first.
    if [[ $was_active == yes && $agent_changed == yes ]]; then
      if [[ -f $root/run/agent-handover ]]; then
        systemctl reload "$unit"
      else
        systemctl restart "$unit"
      fi
    fi
    ;;
  foreground)
    exec "$python" "$root/agent.pyz" run
    ;;
  *)
    echo "TPU_STACK_INIT: '$init' is not allowed; use auto, systemd or foreground" >&2
    exit 2
    ;;
esac
