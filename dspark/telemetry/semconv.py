"""Names the kit's telemetry uses: the GenAI semantic conventions, our `dspark.*` namespace, and the
conventions' histogram bucket boundaries.

The GenAI conventions live in open-telemetry/semantic-conventions-genai (status "Development"). The
`opentelemetry-semantic-conventions` package marks its `gen_ai.*` constants deprecated ("moved"),
with unchanged values, so the strings are written here; a test checks them against that package.
"""

from __future__ import annotations

PROVIDER = "dspark"  # gen_ai.provider.name: a custom value, as the conventions allow
TEXT_COMPLETION = "text_completion"  # gen_ai.operation.name of /v1/completions and gRPC Generate
CHAT = "chat"  # gen_ai.operation.name of /v1/chat/completions

# ---- span and metric attributes (GenAI conventions) -------------------------------------------------
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_REQUEST_TOP_K = "gen_ai.request.top_k"
GEN_AI_REQUEST_SEED = "gen_ai.request.seed"
GEN_AI_REQUEST_STREAM = "gen_ai.request.stream"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_TOKEN_TYPE = "gen_ai.token.type"  # "input" | "output", on gen_ai.client.token.usage
ERROR_TYPE = "error.type"  # stable (opentelemetry.semconv.attributes.error_attributes)

# ---- our speculation attributes, on the request spans --------------------------------------------------
DRAFTER = "dspark.drafter"
BLOCK_LENGTH = "dspark.block_length"  # drafted tokens per round at most (gamma)
ROUNDS = "dspark.rounds"  # verify rounds
DRAFTED_TOKENS = "dspark.drafted_tokens"  # proposed by the drafter
VERIFIED_TOKENS = "dspark.verified_tokens"  # of those, put to the target (the scheduler may verify fewer)
ACCEPTED_TOKENS = "dspark.accepted_tokens"
MEAN_ACCEPT_LENGTH = "dspark.mean_accept_length"  # tau, the bonus token included
ACCEPTED_BY_POSITION = "dspark.accepted_by_position"  # [i]: rounds that accepted at least i + 1 drafts
BUDGET_MAX_STEP_TOKENS = "dspark.budget.max_step_tokens"  # the draft budget in force (absent: no limit)
BUDGET_MAX_REQUEST_TOKENS = "dspark.budget.max_request_tokens"
REQUEST_CAP = "dspark.request_cap"  # drafted tokens this request may verify per round, budget applied
SLA_CLASS = "dspark.sla_class"
TIME_IN_QUEUE = "dspark.time_in_queue"  # seconds from admission to its first scheduled step
TIME_TO_FIRST_TOKEN = "dspark.time_to_first_token"  # seconds, admission to first token
TIME_PER_OUTPUT_TOKEN = "dspark.time_per_output_token"  # seconds per token after the first
REQUEST_ID = "dspark.request_id"  # the client's label (Abort uses it)
REPLICA_ID = "dspark.replica.id"

# ---- engine steps: span events "dspark.step" on the requests that took part -----------------------------
STEP_EVENT = "dspark.step"
STEP_INDEX = "dspark.step.index"
STEP_BATCH_SIZE = "dspark.step.batch_size"  # requests in the forward (decoding + prefill chunks)
STEP_DECODING = "dspark.step.decoding"
STEP_NUM_TOKENS = "dspark.step.num_tokens"  # tokens in the forward
STEP_VERIFIED_TOKENS = "dspark.step.verified_tokens"  # drafted tokens verified, whole batch
STEP_ACCEPTED_TOKENS = "dspark.step.accepted_tokens"
STEP_DRAFTING = "dspark.step.drafting"  # False: the draft gate skipped drafting this step
STEP_SCHEDULER = "dspark.step.scheduler"  # the verify-length policy (EngineConfig.scheduler)
STEP_PREDICTED_FORWARD = "dspark.step.predicted_forward_s"  # 1 / SPS(num_tokens) from the cost table
STEP_MEASURED_FORWARD = "dspark.step.measured_forward_s"
STEP_DURATION = "dspark.step.duration_s"
STEP_REQUEST_PROPOSED = "dspark.step.request.proposed"  # this request's share of the step
STEP_REQUEST_VERIFIED = "dspark.step.request.verified"
STEP_REQUEST_ACCEPTED = "dspark.step.request.accepted"

# ---- resource attributes beside the standard ones (service.*, host.name, process.pid) -----------------
ROLE = "dspark.role"  # "ingress" | "replica"
NODE_ID = "dspark.node.id"  # the Ray node
APP = "dspark.app"
DEPLOYMENT = "dspark.deployment"

# ---- metric names ---------------------------------------------------------------------------------------
TTFT = "gen_ai.server.time_to_first_token"
TPOT = "gen_ai.server.time_per_output_token"
REQUEST_DURATION = "gen_ai.server.request.duration"
CLIENT_TOKEN_USAGE = "gen_ai.client.token.usage"

# Bucket boundaries the conventions give (gen-ai-metrics.md), in seconds / tokens.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TOKEN_USAGE_BUCKETS = tuple(4**i for i in range(14))  # 1, 4, 16, ..., 67108864
