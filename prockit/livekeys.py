"""The broker.conf keys a running broker group changes live (``UpdateBrokerConfig``, mqadmin
updateBrokerConfig; docs/CONFIG.md "Live keys"): every other key is read once at start and
needs a restart.

The broker's key table (broker.configkeys) marks each of these keys ``live`` and checks at
import that its marks are exactly this list; mqadmin, which loads no server package, reads the
list to refuse any other key before it calls a broker.
"""

from __future__ import annotations

LIVE_BROKER_KEYS = frozenset(
    {
        "autoCreateTopicEnable",
        "consumerOffsetCommitIntervalMs",
        "dedupWindowMaxIds",
        "dedupWindowSeconds",
        "defaultTopicQueueNums",
        "diskCheckIntervalMs",
        "diskMaxUsedSpaceRatio",
        "diskSpaceResumeRatio",
        "diskSpaceWarningLevelRatio",
        "offsetGroupsPerUser",
        "pendingOffsetsPerUser",
        "popWaitersPerUser",
        "scrubBytesPerSec",
        "scrubRecordsPerSecond",
        "slaveReadEnable",
        "subscriptionGroupsPerUser",
        "timerMaxDelaySec",
        "topicsPerUser",
    }
)
# What a refusal of a key that is read at start says (the broker's and mqadmin's).
RESTART_HINT = "needs a restart: edit broker.conf on every node"
