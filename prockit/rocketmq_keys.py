"""The names of the keys RocketMQ's broker and NameServer read from their properties files.

RocketMQ fills its config objects from a properties file by setter: key ``fooBar`` sets
``setFooBar`` of ``BrokerConfig``, ``MessageStoreConfig``, ``NettyServerConfig``,
``NettyClientConfig`` (and, since 5.3, ``AuthConfig``) for ``mqbroker -c``, of ``NamesrvConfig``
and the two Netty configs for ``mqnamesrv -c``. An operator's broker.conf is written against
those names, so raftmq accepts every one of them: the ones it implements (with RocketMQ's name
and a meaning docs/CONFIG.md states) through its own key tables, the others with one warning
that lists them (``known_but_unused``). A key in none of these sets, and not raftmq's own, is a
typo and is refused.

Only the names are listed here (RocketMQ 5.3's setters), sorted; what RocketMQ does with them
is in its documentation.
"""

from __future__ import annotations

from collections.abc import Collection


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# BrokerIdentity (4 keys)
BROKER_IDENTITY = _names("brokerClusterName brokerId brokerName inBrokerContainer ")

# BrokerConfig (210 keys)
BROKER_CONFIG = _names(
    "accountStatsEnable accountStatsPrintZeroValues ackMessageThreadPoolNums "
    "ackThreadPoolQueueCapacity aclEnable adminBrokerThreadPoolNums "
    "adminBrokerThreadPoolQueueCapacity allowRecallWhenBrokerNotWriteable appendAckAsync "
    "appendCkAsync asyncSendEnable autoCreateSubscriptionGroup autoCreateTopicEnable "
    "autoDeleteUnusedStats broadcastOffsetExpireMaxSecond broadcastOffsetExpireSecond "
    "brokerConfigPath brokerElectionPriority brokerFastFailureEnable brokerHeartbeatInterval "
    "brokerIP1 brokerIP2 brokerNotActiveTimeoutMillis brokerPermission brokerTopicEnable "
    "cgColdReadThreshold channelExpiredTimeout checkSyncStateSetPeriod "
    "cleanOfflineBrokerInterval clearRetryTopicWhenDeleteTopic "
    "clientManagerThreadPoolQueueCapacity clientManageThreadPoolNums clusterTopicEnable "
    "coldCtrStrategyEnable commercialBaseCount commercialSizePerMsg compatibleWithOldNameSrv "
    "compressedRegister configBlackList configManagerVersion consumerFallbehindThreshold "
    "consumerManagerThreadPoolQueueCapacity consumerManageThreadPoolNums "
    "consumerOffsetUpdateVersionStep controllerAddr controllerHeartBeatTimeoutMills "
    "defaultMessageRequestMode defaultPopShareQueueNum defaultTopicQueueNums "
    "delayOffsetUpdateVersionStep disableConsumeIfConsumerReadSlowly "
    "enableBroadcastOffsetStore enableCalcFilterBitMap enableConnectionMetrics "
    "enableControllerMode enableCreateSysGroup enableDetailStat enableFastChannelEventProcess "
    "enableLagAndDlqMetrics enableLmqStats enableMessageStoreMetrics enableMixedMessageType "
    "enableNetWorkFlowControl enableNotifyAfterPopOrderLockRelease "
    "enableNotifyBeforePopCalculateLag enablePopBatchAck enablePopBufferMerge enablePopLog "
    "enablePopMessageThreshold enablePopMetrics enablePropertyFilter enableRegisterProducer "
    "enableRemoteEscape enableRemotingMetrics enableRequestMetrics enableRetryTopicV2 "
    "enableSingleTopicRegister enableSkipLongAwaitingAck enableSlaveActingMaster "
    "enableSplitMetadata enableSplitRegistration enableStatsMetrics enableTransactionMetrics "
    "endTransactionPoolQueueCapacity endTransactionThreadPoolNums estimateAccumulation "
    "expectConsumerNumUseFilter fetchControllerAddrByDnsLookup "
    "fetchNamesrvAddrByAddressServer fetchNameSrvAddrByDnsLookup fetchNamesrvAddrInterval "
    "filterDataCleanTimeSpan filterSupportRetry flushConsumerOffsetHistoryInterval "
    "flushConsumerOffsetInterval forceRegister forwardTimeout globalColdReadThreshold "
    "heartbeatThreadPoolNums heartbeatThreadPoolQueueCapacity highSpeedMode "
    "initPopOffsetByCheckMsgInMem isolateLogEnable listenPort litePullMessageEnable "
    "litePullMessageThreadPoolNums litePullThreadPoolQueueCapacity "
    "loadBalancePollNameServerInterval loadBalanceProcessorThreadPoolNums "
    "loadBalanceThreadPoolQueueCapacity lockInStrictMode longPollingEnable "
    "maxErrorRateOfBloomFilter maxPopPollingSize maxStatsIdleTimeInMinutes messageStorePlugIn "
    "metricGrpcExporterIntervalInMills metricGrpcExporterTimeOutInMills "
    "metricLoggingExporterIntervalInMills metricsExporterType metricsGrpcExporterHeader "
    "metricsGrpcExporterTarget metricsInDelta metricsLabel metricsOtelCardinalityLimit "
    "metricsPromExporterHost metricsPromExporterPort msgTraceTopicName namesrvAddr "
    "notifyConsumerIdsChangedEnable popCkMaxBufferSize popCkOffsetMaxQueueSize "
    "popCkStayBufferTime popCkStayBufferTimeOut popConsumerFSServiceInit "
    "popConsumerKVServiceEnable popConsumerKVServiceInit popConsumerKVServiceLog "
    "popFromRetryProbability popInflightMessageThreshold popLongPollingForceNotifyInterval "
    "popPollingMapExpireTimeSeconds popPollingMapSize popPollingSize "
    "popResponseReturnActualRetryTopic popReviveMaxAttemptTimes popReviveMaxReturnSizePerRead "
    "printChannelGroups printChannelGroupsMinNum processReplyMessageThreadPoolNums "
    "pullMessageThreadPoolNums pullThreadPoolQueueCapacity putMessageFutureThreadPoolNums "
    "putThreadPoolQueueCapacity queryMessageThreadPoolNums queryThreadPoolQueueCapacity "
    "realTimeNotifyConsumerChange recallMessageEnable recoverConcurrently "
    "recoverThreadPoolNums regionId registerBrokerTimeoutMills registerNameServerPeriod "
    "rejectPullConsumerEnable rejectTransactionMessage replyThreadPoolQueueCapacity "
    "retrieveMessageFromPopRetryTopicV1 reviveAckWaitMs reviveInterval reviveMaxSlow "
    "reviveQueueNum reviveScanTime rocketmqHome sendHeartbeatTimeoutMillis "
    "sendMessageThreadPoolNums sendThreadPoolQueueCapacity serverLoadBalancerEnable "
    "shortPollingTimeMills skipPreOnline skipWhenCKRePutReachMaxTimes slaveReadEnable "
    "splitMetadataSize splitRegistrationSize startAcceptSendRequestTimeStamp "
    "storeReplyMessageEnable subscriptionExpiredTimeout syncBrokerMemberGroupPeriod "
    "syncBrokerMetadataPeriod syncControllerMetadataPeriod traceOn traceTopicEnable "
    "transactionCheckInterval transactionCheckMax transactionMetricFlushInterval "
    "transactionOpBatchInterval transactionOpMsgMaxSize transactionTimeOut transferMsgByHeap "
    "updateNameServerAddrPeriod usePIDColdCtrStrategy useServerSideResetOffset "
    "useStaticSubscription validateSystemTopicWhenUpdateTopic waitTimeMillsInAckQueue "
    "waitTimeMillsInAdminBrokerQueue waitTimeMillsInHeartbeatQueue "
    "waitTimeMillsInLitePullQueue waitTimeMillsInPullQueue waitTimeMillsInSendQueue "
    "waitTimeMillsInTransactionQueue "
)

# MessageStoreConfig (187 keys)
MESSAGE_STORE_CONFIG = _names(
    "accessMessageInMemoryHotRatio accessMessageInMemoryMaxRatio allAckInSyncStateSet "
    "asyncLearner autoMessageVersionOnTopicLen batchDispatchRequestThreadPoolNums "
    "bitMapLengthConsumeQueueExt bottomMostCompressionTypeForConsumeQueueStore brokerRole "
    "checkCRCOnRecover cleanFileForciblyEnable cleanResourceInterval "
    "cleanRocksDBDirtyCQIntervalMin cleanSwapedMapInterval coldDataFlowControlEnable "
    "coldDataScanEnable combineAssignOffsetCQType combineCQEnableCheckSelf "
    "combineCQLoadingCQTypes combineCQMaxExtraSearchCommitLogFiles combineCQPreferCQType "
    "commitCommitLogLeastPages commitCommitLogThoroughInterval commitIntervalCommitLog "
    "commitLogForceSwapMapInterval commitLogSwapMapInterval commitLogSwapMapReserveFileNum "
    "compactionCqMappedFileSize compactionMappedFileSize compactionScheduleInternal "
    "compactionThreadNum correctLogicMinOffsetForceInterval "
    "correctLogicMinOffsetSleepInterval dataReadAheadEnable debugLockEnable "
    "defaultQueryMaxNum deleteCommitLogFilesInterval deleteConsumeQueueFilesInterval "
    "deleteFileBatchMax deleteWhen destroyMapedFileIntervalForcibly disappearTimeAfterStart "
    "diskFallRecorded diskMaxUsedSpaceRatio diskSpaceCleanForciblyRatio "
    "diskSpaceWarningLevelRatio dispatchCqCacheNum dispatchCqThreads dispatchFromSenderThread "
    "dLegerGroup dLegerPeers dLegerSelfId duplicationEnable enableAcceleratedRecovery "
    "enableAsyncReput enableAutoInSyncReplicas enableBatchPush "
    "enableBuildConsumeQueueConcurrently enableCleanExpiredOffset enableCompaction "
    "enableConsumeQueueExt enabledAppendPropCRC enableDLegerCommitLog enableLmq "
    "enableLogConsumeQueueRepeatedlyBuildWhenRecover enableMultiDispatch enableRocksDBLog "
    "enableRunningFlagsInFlush enableScheduleAsyncDeliver enableScheduleMessageStats "
    "fastFailIfNoBufferInStorePool fileReservedTime flushCommitLogLeastPages "
    "flushCommitLogThoroughInterval flushCommitLogTimed flushConsumeQueueLeastPages "
    "flushConsumeQueueThoroughInterval flushDelayOffsetInterval flushDiskType "
    "flushIntervalCommitLog flushIntervalConsumeQueue flushLeastPagesWhenWarmMapedFile "
    "forceVerifyPropCRC haFlowControlEnable haHousekeepingInterval haListenPort "
    "haMasterAddress haMaxGapNotInSync haMaxTimeSlaveNotCatchup haSendHeartbeatInterval "
    "haTransferBatchSize inSyncReplicas logicalDiskSpaceCleanForciblyThreshold "
    "logicQueueForceSwapMapInterval logicQueueSwapMapInterval logicQueueSwapMapReserveFileNum "
    "mappedFileSizeCommitLog mappedFileSizeConsumeQueue mappedFileSizeConsumeQueueExt "
    "mappedFileSizeTimerLog mappedFileSwapEnable mapperFileSizeBatchConsumeQueue "
    "maxAsyncPutMessageRequests maxBatchDeleteFilesNum maxChecksumRange maxConsumeQueueScan "
    "maxFilterMessageSize maxHashSlotNum maxHaTransferByteInSecond maxIndexNum "
    "maxLmqConsumeQueueNum maxMessageSize maxMsgsNumBatch maxOffsetMapSize "
    "maxRecoveryCommitlogFiles maxSlaveResendLength maxTopicLength "
    "maxTransferBytesOnMessageInDisk maxTransferBytesOnMessageInMemory "
    "maxTransferCountOnMessageInDisk maxTransferCountOnMessageInMemory "
    "memTableFlushIntervalMs messageDelayLevel messageIndexEnable messageIndexSafe "
    "minInSyncReplicas offsetCheckInSlave osPageCacheBusyTimeOutMills preferredLeaderId "
    "pullBatchMaxMessageCount putConsumeQueueDataByFileChannel putMessageTimeout "
    "putMsgIndexHightWater readOnlyCommitLogStorePaths readUnCommitted "
    "realTimePersistRocksDBConfig recheckReputOffsetFromCq redeleteHangedFileInterval "
    "replicasPerDiskPartition rocksdbCompressionType rocksdbCQDoubleWriteEnable "
    "rocksdbFlushWalFrequency rocksdbWalFileRollingThreshold sampleCountThreshold sampleSteps "
    "scheduleAsyncDeliverMaxPendingLimit scheduleAsyncDeliverMaxResendNum2Blocked "
    "searchBcqByCacheEnable slaveTimeout spinLockCollisionRetreatOptimalDegree "
    "statRocksDBCQIntervalSec storePathBrokerIdentity storePathCommitLog "
    "storePathDLedgerCommitLog storePathEpochFile storePathRootDir storeType syncFlushTimeout "
    "syncFromLastFile syncMasterFlushOffsetWhenStartup timerColdDataCheckIntervalMs "
    "timerCongestNumEachSlot timerEnableCheckMetrics timerEnableRetryUntilSuccess "
    "timerFlushIntervalMs timerGetMessageThreadNum timerInterceptDelayLevel timerMaxDelaySec "
    "timerMetricSmallThreshold timerPrecisionMs timerProgressLogIntervalMs "
    "timerPutMessageThreadNum timerRollWindowSlot timerSkipUnknownError timerStopEnqueue "
    "timerWheelEnable topicQueueLockNum totalReplicas transientStorePoolEnable "
    "transientStorePoolSize travelCqFileNumWhenGetMessage useABSLock "
    "useReentrantLockWhenPutMessage wakeCommitWhenPutMessage wakeFlushWhenPutMessage "
    "warmMapedFileEnable writeWithoutMmap "
)

# NettyServerConfig (18 keys)
NETTY_SERVER_CONFIG = _names(
    "bindAddress enableShutdownGracefully listenPort serverAsyncSemaphoreValue "
    "serverCallbackExecutorThreads serverChannelMaxIdleTimeSeconds "
    "serverNettyWorkerGroupEnable serverOnewaySemaphoreValue "
    "serverPooledByteBufAllocatorEnable serverSelectorThreads serverSocketBacklog "
    "serverSocketRcvBufSize serverSocketSndBufSize serverWorkerThreads "
    "shutdownWaitTimeSeconds useEpollNativeSelector writeBufferHighWaterMark "
    "writeBufferLowWaterMark "
)

# NettyClientConfig (20 keys)
NETTY_CLIENT_CONFIG = _names(
    "channelNotActiveInterval clientAsyncSemaphoreValue clientCallbackExecutorThreads "
    "clientChannelMaxIdleTimeSeconds clientCloseSocketIfTimeout clientOnewaySemaphoreValue "
    "clientPooledByteBufAllocatorEnable clientSocketRcvBufSize clientSocketSndBufSize "
    "clientWorkerThreads connectTimeoutMillis disableCallbackExecutor disableNettyWorkerGroup "
    "enableReconnectForGoAway maxReconnectIntervalTimeSeconds scanAvailableNameSrv "
    "socksProxyConfig useTLS writeBufferHighWaterMark writeBufferLowWaterMark "
)

# AuthConfig (26 keys)
AUTH_CONFIG = _names(
    "aclCacheExpiredSecond aclCacheMaxNum aclCacheRefreshSecond authConfigPath "
    "authenticationEnabled authenticationMetadataProvider authenticationProvider "
    "authenticationStrategy authenticationWhitelist authorizationEnabled "
    "authorizationMetadataProvider authorizationProvider authorizationStrategy "
    "authorizationWhitelist clusterName configName initAuthenticationUser "
    "innerClientAuthenticationCredentials migrateAuthFromV1Enabled "
    "statefulAuthenticationCacheExpiredSecond statefulAuthenticationCacheMaxNum "
    "statefulAuthorizationCacheExpiredSecond statefulAuthorizationCacheMaxNum "
    "userCacheExpiredSecond userCacheMaxNum userCacheRefreshSecond "
)

# NamesrvConfig (22 keys)
NAMESRV_CONFIG = _names(
    "clientRequestThreadPoolNums clientRequestThreadPoolQueueCapacity clusterTest "
    "configBlackList configStorePath defaultThreadPoolNums defaultThreadPoolQueueCapacity "
    "deleteTopicWithBrokerRegistration enableAllTopicList enableControllerInNamesrv "
    "enableTopicList kvConfigPath needWaitForService notifyMinBrokerIdChanged "
    "orderMessageEnable productEnvName returnOrderTopicConfigToBroker rocketmqHome "
    "scanNotActiveBrokerInterval supportActingMaster unRegisterBrokerQueueCapacity "
    "waitSecondsForService "
)
# What ``mqbroker -c broker.conf`` reads (the auth keys are read from broker.conf since 5.3).
BROKER_KEYS = (
    BROKER_IDENTITY
    | BROKER_CONFIG
    | MESSAGE_STORE_CONFIG
    | NETTY_SERVER_CONFIG
    | NETTY_CLIENT_CONFIG
    | AUTH_CONFIG
)
# What ``mqnamesrv -c namesrv.conf`` reads.
NAMESRV_KEYS = NAMESRV_CONFIG | NETTY_SERVER_CONFIG | NETTY_CLIENT_CONFIG


def known_but_unused(rocketmq_keys: Collection[str], own_keys: Collection[str]) -> frozenset[str]:
    """RocketMQ's keys a raftmq server accepts and ignores: those it has no key of its own for."""
    return frozenset(rocketmq_keys) - frozenset(own_keys)
