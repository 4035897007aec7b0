#!/bin/sh
# Kafka ACLs for a Latch deployment: who may read and write each topic (docs/operations.md,
# "Who may write each topic"). The committed topic executes tools: only the worker writes it.
#
#   BOOTSTRAP=broker:9092 ADMIN_CONFIG=admin.properties deploy/kafka/acls.sh
#   DRY_RUN=1 deploy/kafka/acls.sh        # print the kafka-acls commands, run nothing
#
# Names are the defaults of latch.example.yaml; set the variables below to yours. The same
# ACLs as Strimzi KafkaUser resources: deploy/kafka/users.yaml (tests/runtime/unit/
# test_deploy.py holds the two equal). Topics are created beforehand by an admin
# (`latch topics create`), except the worker's own <APP_ID>- topics faust creates.
set -eu

: "${BOOTSTRAP:=127.0.0.1:9092}"
: "${ADMIN_CONFIG:=}"
: "${KAFKA_ACLS:=kafka-acls.sh}"
# principals (one per service; a KafkaUser of the same name under Strimzi)
: "${GATEWAY:=User:latch-gateway}"
: "${WORKER:=User:latch-worker}"
: "${RUNNER:=User:latch-runner}"
: "${AGENT:=User:latch-agent}"
# worker.app_id (the worker's group, its transactional ids and its own topics), the runners'
# group (Runner's group_id) and the agent loops' group, each a prefix
: "${APP_ID:=latch}"
: "${RUNNER_GROUP:=latch-runner}"
: "${AGENT_GROUP:=latch-agent}"
# topics (the topics section)
: "${EVENTS:=llm.stream.events}"
: "${CONTROL:=llm.stream.control}"
: "${COMMITTED:=tool.calls.committed}"
: "${ERRORS:=tool.calls.errors}"
: "${FINAL:=llm.messages.final}"
: "${PROGRESS:=llm.stream.progress}"
: "${DLQ:=llm.stream.dlq}"
: "${AUDIT:=latch.audit}"
: "${RUN_ENDED:=llm.runs.ended}"
: "${RESULTS:=tool.calls.results}"
: "${JOURNAL:=tool.calls.journal}"
: "${REGISTRY:=latch.registry}"
: "${PENDING:=tool.calls.pending}"
: "${TURNS:=llm.turns}"

# allow PRINCIPAL RESOURCE NAME PATTERN OPERATION...   (RESOURCE: topic, group,
# transactional-id; PATTERN: literal or prefixed)
allow() {
    principal=$1 resource=$2 name=$3 pattern=$4
    shift 4
    ops=""
    for op in "$@"; do ops="$ops --operation $op"; done
    # shellcheck disable=SC2086 # $ops is a list of words on purpose
    set -- "$KAFKA_ACLS" --bootstrap-server "$BOOTSTRAP" --add --allow-principal "$principal" \
        $ops "--$resource" "$name" --resource-pattern-type "$pattern"
    if [ -n "$ADMIN_CONFIG" ]; then set -- "$@" --command-config "$ADMIN_CONFIG"; fi
    if [ -n "${DRY_RUN:-}" ]; then echo "$@"; else "$@"; fi
}

# The gateway publishes the provider streams and the cancels.
allow "$GATEWAY" topic "$EVENTS" literal Write Describe
allow "$GATEWAY" topic "$CONTROL" literal Write Describe
# and follows run.ended (Publisher.on_run_ended: assigned, no group; decision 0015).
allow "$GATEWAY" topic "$RUN_ENDED" literal Read Describe

# The worker: reads events and control; writes every output, and events too (its ticks, and
# the kafka engine's forwarded cancels); checks the topics at start (DescribeConfigs); owns
# <APP_ID>-* topics (the heads changelog, faust's assignor topic), its group and (kafka
# engine) its transactional ids <APP_ID>-<instance_id>.
allow "$WORKER" topic "$EVENTS" literal Read Write Describe DescribeConfigs
allow "$WORKER" topic "$CONTROL" literal Read Describe DescribeConfigs
allow "$WORKER" topic "$COMMITTED" literal Write Describe DescribeConfigs
allow "$WORKER" topic "$ERRORS" literal Write Describe DescribeConfigs
allow "$WORKER" topic "$FINAL" literal Write Describe DescribeConfigs
allow "$WORKER" topic "$PROGRESS" literal Write Describe DescribeConfigs
allow "$WORKER" topic "$DLQ" literal Write Describe DescribeConfigs
allow "$WORKER" topic "$RUN_ENDED" literal Write Describe DescribeConfigs
allow "$WORKER" topic "$PENDING" literal Write Describe DescribeConfigs
# The result latch (docs/contract.md): reads the runners' results (forwarded into the events
# log), writes its own tool_timeout results there, and the turn records.
allow "$WORKER" topic "$RESULTS" literal Read Write Describe DescribeConfigs
allow "$WORKER" topic "$TURNS" literal Write Describe DescribeConfigs
# The registry (decision 0014): read whole at start and followed; the worker writes only its
# clock probes (null values under the key "fence"). `latch registry put` runs as an admin.
allow "$WORKER" topic "$REGISTRY" literal Read Write Describe DescribeConfigs
allow "$WORKER" topic "$AUDIT" literal Write Describe DescribeConfigs
allow "$WORKER" topic "$APP_ID-" prefixed Create Read Write Describe DescribeConfigs
allow "$WORKER" group "$APP_ID" literal Read Describe
allow "$WORKER" transactional-id "$APP_ID-" prefixed Write Describe

# The runners: read the committed calls, write their results. Never Write on the committed
# topic: a principal that may write it can make a runner execute tools.
allow "$RUNNER" topic "$COMMITTED" literal Read Describe
allow "$RUNNER" topic "$RESULTS" literal Write Describe
allow "$RUNNER" group "$RUNNER_GROUP" prefixed Read Describe
# A transactional runner (Runner(transactional_id=...), decision 0012) also reads and writes
# its journal and uses transactional ids <RUNNER_GROUP>-<instance>.
allow "$RUNNER" topic "$JOURNAL" literal Read Write Describe
allow "$RUNNER" transactional-id "$RUNNER_GROUP-" prefixed Write Describe

# The agent loops: read the outcomes and results of their runs.
allow "$AGENT" topic "$FINAL" literal Read Describe
allow "$AGENT" topic "$ERRORS" literal Read Describe
allow "$AGENT" topic "$RESULTS" literal Read Describe
allow "$AGENT" topic "$TURNS" literal Read Describe
allow "$AGENT" topic "$PROGRESS" literal Read Describe
# the calls waiting for approval (docs/policies.md, Approvals): the agent loop or its approval UI shows
# them; decisions go back on the control topic (the gateway's, or the operator's latch approve)
allow "$AGENT" topic "$PENDING" literal Read Describe
allow "$AGENT" group "$AGENT_GROUP" prefixed Read Describe
