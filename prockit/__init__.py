"""What every raftmq process needs around its own work, in one copy each (servers and tools
alike: mqbroker, mqnamesrv, mqcluster, mqjepsen, the benchmarks):

- :mod:`prockit.properties`: strict Java properties files (``broker.conf``, the NameServer's
  config), each server passing its own key table.
- :mod:`prockit.processes`: free ports, children started with their output in a log file, a
  child's exit seen by pid, a server's log set-up and its life until SIGTERM/SIGINT.
- :mod:`prockit.fatal`: fail fast, never half alive: a supervised task or thread that dies
  ends the process with one FATAL line (or restarts it in place).

It imports nothing of the project.
"""
