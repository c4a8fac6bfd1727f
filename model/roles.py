"""The IAM roles and permissions the stack grants and its identities hold: facts the
components declare, the bootstrap grants and the permission proof checks, kept here so
each has one home below all three (cloud.google.com/iam/docs/understanding-roles)."""

from __future__ import annotations

# What components/monitoring.py creates in a project it watches (the stack's own, and
# each team's), the narrowest predefined role for each (policy/iam_roles.json, from
# iann0036/iam-dataset): the deployer of a stack and the platform deployer in the
# teams' folder hold them.
MONITORING_ROLES = {
    "roles/monitoring.dashboardEditor": "monitoring.py's dashboards (monitoring.dashboards.*)",
    "roles/monitoring.alertPolicyEditor": "monitoring.py's alert policies",
    "roles/monitoring.notificationChannelEditor": "monitoring.py's notification channels",
    # No smaller predefined role holds logging.logMetrics.create (roles/logging.admin and
    # logging.configWriter are the two); configWriter also writes sinks, buckets, views.
    "roles/logging.configWriter": "monitoring.py's log-based metrics (job hung, budget "
                                  "runout, team spend)",
}


# Project roles of the deployer: exactly what `pulumi up` of this stack
# creates, reads and deletes (components/*.py), each with its reason.
# projectIamAdmin is limited by an IAM condition (CiIdentity._conditions), and
# actAs and administration are granted on the runtime account's own allow policy
# (DEPLOYER_ACCOUNT_ROLES), so the deployer is not owner in effect: it grants only
# the roles the stack grants, and administers and acts as only the stack's runtime
# accounts. Not a `resource.name` condition on a project-wide serviceAccountAdmin:
# iam.googleapis.com is not among the services that supply resource attributes to
# conditions (cloud.google.com/iam/docs/conditions-resource-attributes), so IAM
# never matches such a grant and the deployer could not manage the account at all.
DEPLOYER_ROLES = {
    "roles/serviceusage.serviceUsageAdmin": "project.py turns the stack's APIs on",
    "roles/compute.networkAdmin": "network.py creates the network and subnetwork",
    "roles/compute.securityAdmin": "network.py creates the firewall rules",
    "roles/tpu.admin": "tpu_node.py / queued_tpu.py create, update, delete TPU nodes; "
                       "tpuctl preflight lists the zone's offers",
    "roles/iam.serviceAccountCreator": "identity.py creates the runtime account (admin of it "
                                       "is granted on that account alone, DEPLOYER_ACCOUNT_ROLES)",
    "roles/resourcemanager.projectIamAdmin": "identity.py grants the runtime account project "
                                             "roles (condition: only the roles the stack grants)",
    **MONITORING_ROLES,
}


# The platform's fleet dashboard sees every team's project: monitoring.py adds each to
# the host project's metrics scope (monitoring.metricsScopes.link on both projects:
# cloud.google.com/monitoring/settings/multiple-projects, as recalled; unconfirmed here).
METRICS_SCOPE_ROLE = "roles/monitoring.metricsScopesAdmin"


# What the deployer no longer holds, and why: whoever runs the first `up` (an
# admin, docs/pr-previews.md) creates these protected resources; a later change
# to them is an admin's `up` again.
# - roles/iam.roleAdmin: a custom role's permissions cannot be limited by a
#   condition (modifiedGrantsByRole limits setIamPolicy, not iam.roles.update), and
#   with it the deployer could widen its own storage role.
# - roles/iam.workloadIdentityPoolAdmin: with it the deployer could rewrite the
#   provider's attribute condition and mapping, i.e. who may act as the deployer.
BOOTSTRAP_ROLES = {
    "roles/iam.roleAdmin": "creates the storage deployer custom role (ci.py)",
    "roles/iam.workloadIdentityPoolAdmin": "creates the pool and its GitHub provider (ci.py)",
    "roles/iam.serviceAccountAdmin": "creates the deployer and preview accounts and who may "
                                     "impersonate them (ci.py)",
    "roles/resourcemanager.projectIamAdmin": "grants the deployer and preview accounts "
                                             "their roles (ci.py)",
}


# The platform stack's deployer in the teams' folder (granted there by the
# bootstrap step, scripts/bootstrap_team_projects.py): what TeamProject manages
# inside projects it did not create. No roles/resourcemanager.projectCreator and
# no roles/billing.user: projects are made and linked to billing by the bootstrap
# (an admin), so the deployer cannot make projects outside every cap and budget.
# Folder roles reach every project in the folder (resource hierarchy): keep the
# folder for team projects only. No roles/iam.roleAdmin: with it the deployer could
# add any permission to a custom role its projectIamAdmin condition lets it grant
# (modifiedGrantsByRole limits role names, not their content); the custom roles are
# the bootstrap's, made with a fixed permission list (model/bootstrap.py, issue 44).
PLATFORM_FOLDER_ROLES = {
    "roles/serviceusage.serviceUsageAdmin": "TeamProject enables each team project's APIs",
    "roles/resourcemanager.projectIamAdmin": "TeamProject's project grants (the bootstrap "
                                             "limits it with modifiedGrantsByRole)",
    "roles/iam.serviceAccountAdmin": "the teams' runtime, deployer and preview accounts",
    "roles/iam.workloadIdentityPoolAdmin": "each team deployer's pool and GitHub provider",
    "roles/cloudquotas.admin": "the teams' TPU quota caps",
    "roles/compute.xpnAdmin": "attaches team projects to the Shared VPC host",
    "roles/tpu.admin": "the team nodes the platform stack declares",
    "roles/storage.admin": "the team buckets the platform stack declares; allUsers and "
                           "other domains are refused by the folder's org policies",
    **MONITORING_ROLES,
    METRICS_SCOPE_ROLE: "each team project joins the fleet dashboard's metrics scope",
}


# Org policies the bootstrap sets on the folder (and the host project): IAM refuses
# a member outside the organization's domains, allUsers and allAuthenticatedUsers
# included (cloud.google.com/resource-manager/docs/organization-policy/
# restricting-domains), so no storage role can grant arbitrary members; buckets
# refuse public access (cloud.google.com/storage/docs/public-access-prevention);
# new projects get no default network (compute.skipDefaultNetworkCreation, as
# Project(auto_create_network=False) did). Unconfirmed: that domain restriction
# admits the workload identity pool principalSets the team deployers' accounts are
# bound to; if it refused them, that grant's `up` fails (closed, not open).
# A node (or VM) made without an account runs as the Compute Engine default account,
# made Editor of every new project unless iam.automaticIamGrantsForDefaultServiceAccounts
# is enforced (cloud.google.com/resource-manager/docs/organization-policy/
# restricting-service-accounts, "Disable automatic role grants to default service
# accounts"): enforced on the folder (issue 34, finding 9).
DOMAIN_POLICY = "iam.allowedPolicyMemberDomains"


ENFORCED_POLICIES = ("storage.publicAccessPrevention", "compute.skipDefaultNetworkCreation",
                     "iam.automaticIamGrantsForDefaultServiceAccounts")


# A team's deployer (components/teams.py declares it in the team's project): TPU
# nodes and, through the team's storage role, buckets of its own project; actAs on
# the team's runtime account and use of the platform's subnets are granted on
# those resources alone (teams.py). No IAM administration at project level.
TEAM_DEPLOYER_ROLES = {
    "roles/tpu.admin": "the team stack's TPU nodes, in the team's project only",
}


# A TPU node runs as the runtime account: the deployer needs actAs on it, and
# updates and deletes it (serviceAccountAdmin), both granted on that account's own
# allow policy, never project-wide (where they would reach every account of the
# project, the Compute Engine default one and the deployer itself included).
DEPLOYER_ACCOUNT_ROLE = "roles/iam.serviceAccountUser"


DEPLOYER_ACCOUNT_ROLES = (DEPLOYER_ACCOUNT_ROLE, "roles/iam.serviceAccountAdmin")


MODIFIED_GRANTS = "iam.googleapis.com/modifiedGrantsByRole"


def grants_only(roles: list[str]) -> str:
    """An IAM condition on projectIamAdmin: the request changes only `roles`
    (cloud.google.com/iam/docs/setting-limits-on-granting-roles; the attribute is
    the roles a setIamPolicy call adds or removes, conditions-attribute-reference)."""
    listed = ", ".join(f"'{role}'" for role in sorted(roles))
    return f"api.getAttribute('{MODIFIED_GRANTS}', []).hasOnly([{listed}])"


# Project roles of the preview account. `pulumi preview` reads the state from
# the backend, not from GCP, and changes nothing: the diy backend takes no lock
# and writes no checkpoint or history on a preview (pulumi/pulumi
# pkg/backend/diy/backend.go, Preview and apply: no snapshot manager when
# DryRun). What the program itself reads from GCP while it runs is all that
# needs a grant.
PREVIEW_ROLES = {
    "roles/browser": "reads the project and its folder (resourcemanager.projects.get), "
                     "nothing else",
}


# storage.py and package.py need bucket creation; the only predefined role
# with storage.buckets.create is roles/storage.admin, which the policy pack
# forbids at project level. A custom role carries just these permissions
# (cloud.google.com/storage/docs/access-control/iam-permissions).
STORAGE_PERMISSIONS = (
    "storage.buckets.create",
    "storage.buckets.delete",
    "storage.buckets.get",
    "storage.buckets.list",
    "storage.buckets.update",
    "storage.buckets.getIamPolicy",
    "storage.buckets.setIamPolicy",
    "storage.objects.create",
    "storage.objects.delete",
    "storage.objects.get",
    "storage.objects.list",
)


# Custom role ids are per project: each stack gets its own (Naming.custom_role_id).
STORAGE_ROLE = "tpuStackStorageDeployer"


# Project roles a TPU VM job needs: its logs and metrics, and TPU viewing,
# which a pod slice's TPUClusterResolver uses to find its workers (TPU_NAME).
PROJECT_ROLES = (
    "roles/logging.logWriter",
    "roles/monitoring.metricWriter",
    "roles/tpu.viewer",
)


# Project roles of a team's members: see the project's TPU nodes (node names,
# state, health). Logs are the team's logs bucket (RuntimeIdentity grants it):
# roles/logging.viewer would show every team's logs.
MEMBER_PROJECT_ROLES = ("roles/tpu.viewer",)


# Shared VPC (cloud.google.com/vpc/docs/shared-vpc): a service project's
# principals use the host's subnets through roles/compute.networkUser, granted
# here per subnet, not on the host project. The Cloud TPU service agent of the
# service project (service-<number>@gcp-sa-tpu.iam.gserviceaccount.com,
# cloud.google.com/iam/docs/service-agents, "TPU Service Agent (v2)") needs it to
# place a node in a host subnet, and roles/tpu.xpnAgent on the host project
# (terraform-google-modules/terraform-google-project-factory
# modules/shared_vpc_access/main.tf, "Required for Cloud TPU API").
NETWORK_USER_ROLE = "roles/compute.networkUser"


TPU_XPN_AGENT_ROLE = "roles/tpu.xpnAgent"


TPU_AGENT_DOMAIN = "gcp-sa-tpu.iam.gserviceaccount.com"


# The TPU custom role's id in the team's project (naming.custom_role_id): the bootstrap
# creates it and names it in the folder's grant condition (model/bootstrap.py).
BUDGET_STOP_ROLE = "budget_stop"


# What the budget-stop function does in the team's project, and only there (a custom
# role: no predefined TPU role is this narrow; roles/tpu.admin would also create nodes).
# IAM permission names: cloud.google.com/iam/docs/roles-permissions/tpu (ops/tpu/api.py
# PERMISSIONS): list and get to find them, update to set the stop request, delete.
# Its queued resources are checked with the node permissions: IAM has no
# tpu.queuedResources.* permission (a custom role listing one is refused, `400
# Permission ... is not valid`, terraform-google-modules/terraform-google-iam#158);
# iann0036/iam-dataset gcp/map.json maps tpu.projects.locations.queuedResources.
# {list,get,delete} to tpu.nodes.{list,get,delete}.
BUDGET_STOP_PERMISSIONS = ("tpu.nodes.list", "tpu.nodes.get", "tpu.nodes.update",
                           "tpu.nodes.delete", "tpu.operations.get")


# Its markers: create only (no read, no overwrite: storage.objects.delete would be needed
# for that, cloud.google.com/storage/docs/access-control/iam-permissions, no delete).
MARKER_PERMISSIONS = ("storage.objects.create",)


def marker_role(team: str) -> str:
    """The markers' custom role id (naming.custom_role_id) in the host project."""
    return f"budget_stop_markers_{team}"


# The controller's custom roles (components/controller.py; docs/design.md, "The
# controller"), made by the bootstrap with these fixed lists (model/bootstrap.py
# custom_roles): its TPU role in every project it manages, and its objects role in the
# host project, granted there on its bucket under a condition (its prefix, the markers).
CONTROLLER_ROLE = "controller"
CONTROLLER_OBJECTS_ROLE = "controller_objects"
# List, place, stop and delete nodes and their queued resources. IAM checks every
# queuedResources method with the tpu.nodes.* permission of the same verb (iann0036/
# iam-dataset gcp/map.json: queuedResources.{list,get,create,delete,reset} ->
# tpu.nodes.{list,get,create,delete,reset}); stop is a node method (ops/tpu/api.py).
CONTROLLER_PERMISSIONS = ("tpu.nodes.list", "tpu.nodes.get", "tpu.nodes.create",
                          "tpu.nodes.update", "tpu.nodes.stop", "tpu.nodes.delete",
                          "tpu.nodes.reset", "tpu.operations.get")
# Read the manifests and markers, write the lease, moves and audit (an overwrite is a
# delete too: cloud.google.com/storage/docs/access-control/iam-permissions).
# What it reads in the stacks' own buckets: their manifests and their agents' status
# objects (get and list; cloud.google.com/storage/docs/access-control/iam-roles).
CONTROLLER_READ_ROLE = "roles/storage.objectViewer"
CONTROLLER_OBJECT_PERMISSIONS = ("storage.objects.get", "storage.objects.list",
                                 "storage.objects.create", "storage.objects.delete")


# Object roles per bucket purpose: read what the job consumes, write what it
# produces. roles/storage.objectUser is read/write/delete on objects without
# any IAM or bucket administration (cloud.google.com/storage/docs/access-control/iam-roles).
BUCKET_ROLES = {
    "data": "roles/storage.objectViewer",
    "artifacts": "roles/storage.objectViewer",
    "checkpoints": "roles/storage.objectUser",
    "logs": "roles/storage.objectUser",
}


# TensorFlow's GCS filesystem reads bucket metadata (storage.buckets.get) to
# check that a bucket exists before it writes; legacyBucketReader grants that
# and object listing, nothing else (same page, "Basic roles and legacy roles").
BUCKET_METADATA_ROLE = "roles/storage.legacyBucketReader"


# A team's members may run as the team's account (actAs: start work as it,
# never mint its tokens, which needs serviceAccountTokenCreator) and read the
# team's logs bucket, where the node agent writes status and logs (docs/design.md).
ACT_AS_ROLE = "roles/iam.serviceAccountUser"


MEMBER_BUCKET_ROLES = {"logs": "roles/storage.objectViewer"}


# Who may impersonate an account through the pool (cloud.google.com/iam/docs/
# workload-identity-federation-with-deployment-pipelines, "Workload Identity User").
IMPERSONATION_ROLE = "roles/iam.workloadIdentityUser"
