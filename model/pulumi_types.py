"""Every Pulumi type token tpu-stack names: the one place they are spelled.

A token is `package:module:Type` (www.pulumi.com/docs/iac/concepts/resources/names/#types).
The components pass theirs to ComponentResource from here; the plan, its reports, the
policy pack, the permission proof and the tests match resources by these names. Pure
strings: importing this module imports no pulumi.
"""

from __future__ import annotations

# ---- our components (tpu-stack:index:*, components/) --------------------------------
COMPONENT_PREFIX = "tpu-stack:index:"
COMPONENT_BUDGET_STOP = "tpu-stack:index:BudgetStop"
COMPONENT_CI_IDENTITY = "tpu-stack:index:CiIdentity"
COMPONENT_NETWORK = "tpu-stack:index:Network"
COMPONENT_PROJECT = "tpu-stack:index:Project"
COMPONENT_RUNTIME_IDENTITY = "tpu-stack:index:RuntimeIdentity"
COMPONENT_TEAM_PROJECT = "tpu-stack:index:TeamProject"
COMPONENT_TEAM_SPACE = "tpu-stack:index:TeamSpace"
COMPONENT_TPU_NODE = "tpu-stack:index:TpuNode"
COMPONENT_TPU_PLATFORM = "tpu-stack:index:TpuPlatform"
COMPONENT_TRAINING_BUCKETS = "tpu-stack:index:TrainingBuckets"
COMPONENT_TRAINING_PACKAGE = "tpu-stack:index:TrainingPackage"

# ---- our dynamic providers (components/queued_tpu.py, components/fallback_tpu.py) ----
# pulumi.dynamic.Resource's type is f"pulumi-python:dynamic/{module}:{name}" from the
# subclass's `module` and `name` (pulumi/dynamic/dynamic.py, Resource.__init_subclass__),
# "pulumi-python:dynamic:Resource" without them.
DYNAMIC_PREFIX = "pulumi-python:dynamic"
DYNAMIC_MODULE = "tpu"
QUEUED_TPU_NAME = "QueuedTpu"
FALLBACK_TPU_NAME = "FallbackTpu"
DYNAMIC_QUEUED_TPU = f"{DYNAMIC_PREFIX}/{DYNAMIC_MODULE}:{QUEUED_TPU_NAME}"
DYNAMIC_FALLBACK_TPU = f"{DYNAMIC_PREFIX}/{DYNAMIC_MODULE}:{FALLBACK_TPU_NAME}"
DYNAMIC_RESOURCE = f"{DYNAMIC_PREFIX}:Resource"

# ---- Pulumi's own ---------------------------------------------------------------------
PROVIDER_PREFIX = "pulumi:providers:"
PULUMI_PREFIX = "pulumi:pulumi:"
PROVIDER_GCP = "pulumi:providers:gcp"
PULUMI_STACK = "pulumi:pulumi:Stack"
PULUMI_STACK_REFERENCE = "pulumi:pulumi:StackReference"

# ---- pulumi-gcp resources (each class's `__init__` passes its token: pulumi_gcp/<module>/
# <file>.py, e.g. pulumi_gcp/tpu/v2_vm.py 'gcp:tpu/v2Vm:V2Vm') -----------------------------
BILLING_BUDGET = "gcp:billing/budget:Budget"
CLOUDFUNCTIONSV2_FUNCTION = "gcp:cloudfunctionsv2/function:Function"
CLOUDQUOTA_S_QUOTA_PREFERENCE = "gcp:cloudquota/sQuotaPreference:SQuotaPreference"
CLOUDRUNV2_SERVICE_IAM_MEMBER = "gcp:cloudrunv2/serviceIamMember:ServiceIamMember"
CLOUDSCHEDULER_JOB = "gcp:cloudscheduler/job:Job"
COMPUTE_FIREWALL = "gcp:compute/firewall:Firewall"
COMPUTE_NETWORK = "gcp:compute/network:Network"
COMPUTE_SHARED_VPC_HOST_PROJECT = "gcp:compute/sharedVPCHostProject:SharedVPCHostProject"
COMPUTE_SHARED_VPC_SERVICE_PROJECT = ("gcp:compute/sharedVPCServiceProject:"
                                      "SharedVPCServiceProject")
COMPUTE_SUBNETWORK = "gcp:compute/subnetwork:Subnetwork"
COMPUTE_SUBNETWORK_IAM_MEMBER = "gcp:compute/subnetworkIAMMember:SubnetworkIAMMember"
DNS_MANAGED_ZONE = "gcp:dns/managedZone:ManagedZone"
FOLDER_IAM_MEMBER = "gcp:folder/iAMMember:IAMMember"
IAM_WORKLOAD_IDENTITY_POOL = "gcp:iam/workloadIdentityPool:WorkloadIdentityPool"
IAM_WORKLOAD_IDENTITY_POOL_PROVIDER = ("gcp:iam/workloadIdentityPoolProvider:"
                                       "WorkloadIdentityPoolProvider")
LOGGING_METRIC = "gcp:logging/metric:Metric"
MONITORING_ALERT_POLICY = "gcp:monitoring/alertPolicy:AlertPolicy"
MONITORING_DASHBOARD = "gcp:monitoring/dashboard:Dashboard"
MONITORING_MONITORED_PROJECT = "gcp:monitoring/monitoredProject:MonitoredProject"
MONITORING_NOTIFICATION_CHANNEL = "gcp:monitoring/notificationChannel:NotificationChannel"
ORGANIZATIONS_PROJECT = "gcp:organizations/project:Project"
PROJECTS_IAM_BINDING = "gcp:projects/iAMBinding:IAMBinding"
PROJECTS_IAM_CUSTOM_ROLE = "gcp:projects/iAMCustomRole:IAMCustomRole"
PROJECTS_IAM_MEMBER = "gcp:projects/iAMMember:IAMMember"
PROJECTS_IAM_POLICY = "gcp:projects/iAMPolicy:IAMPolicy"
PROJECTS_SERVICE = "gcp:projects/service:Service"
PROJECTS_SERVICE_IDENTITY = "gcp:projects/serviceIdentity:ServiceIdentity"
PUBSUB_SUBSCRIPTION = "gcp:pubsub/subscription:Subscription"
PUBSUB_TOPIC = "gcp:pubsub/topic:Topic"
PUBSUB_TOPIC_IAM_MEMBER = "gcp:pubsub/topicIAMMember:TopicIAMMember"
SERVICEACCOUNT_ACCOUNT = "gcp:serviceaccount/account:Account"
SERVICEACCOUNT_IAM_BINDING = "gcp:serviceaccount/iAMBinding:IAMBinding"
SERVICEACCOUNT_IAM_MEMBER = "gcp:serviceaccount/iAMMember:IAMMember"
SERVICEACCOUNT_KEY = "gcp:serviceaccount/key:Key"
STORAGE_BUCKET = "gcp:storage/bucket:Bucket"
STORAGE_BUCKET_IAM_BINDING = "gcp:storage/bucketIAMBinding:BucketIAMBinding"
STORAGE_BUCKET_IAM_MEMBER = "gcp:storage/bucketIAMMember:BucketIAMMember"
STORAGE_BUCKET_IAM_POLICY = "gcp:storage/bucketIAMPolicy:BucketIAMPolicy"
STORAGE_BUCKET_OBJECT = "gcp:storage/bucketObject:BucketObject"
TPU_V2_VM = "gcp:tpu/v2Vm:V2Vm"

# ---- pulumi-gcp functions (invoke tokens: pulumi_gcp/<module>/get_*.py) ----------------
ORGANIZATIONS_GET_PROJECT = "gcp:organizations/getProject:getProject"
STORAGE_GET_BUCKET_OBJECTS = "gcp:storage/getBucketObjects:getBucketObjects"
STORAGE_GET_BUCKET_OBJECT_CONTENT = "gcp:storage/getBucketObjectContent:getBucketObjectContent"
