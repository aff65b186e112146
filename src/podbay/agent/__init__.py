"""podbay.agent: the executor that runs inside every sandbox.

It runs commands, keeps spawned processes and their output, and serves
files, over HTTP/1.1 on a unix socket the runtime hands it. It is the
sandbox's init (PID 1) and reaps every child.

It runs on the sandbox image's bare interpreter from a read-only mount, so
every module here imports only the standard library, :mod:`podbay.wire` and
:mod:`podbay.agent` (a test pins this). The runtime stages exactly
``podbay/__init__.py`` (an empty stub), ``podbay/wire/`` and
``podbay/agent/``.

Modules, by concept::

    __main__     options, listening socket, start-up and shutdown
    http         a small threaded HTTP/1.1 server on raw sockets
    app          routes: parse, call a service, serialize
    refusal      the one exception services raise (a contract code + sentence)
    reaper       the only caller of waitpid: reaps every child, orphans included
    launch       starting a command: clean environment, own process group
    guestpids    under gVisor, the commands' pids cgroup in the sandbox's kernel
    environment  the clean base environment and the env file
    exec         run to completion with caps and a deadline
    processes    spawned processes: table, pumps, signals
    ring         the newest-1-MiB output buffer with UTF-8-safe reads
    files        native files: streamed read and write with SHA-256, stat, list
    hibernate    an idle agent hands its socket to a bare waiter until the next connection
    ttysignals   under gVisor, Ctrl-C, Ctrl-\\ and Ctrl-Z become signals (its kernel sends none)
"""

#: The agent's version, reported at ``/v1/info``. Equal to ``podbay.__version__``
#: (a test pins it); restated because the staged ``podbay/__init__.py`` is empty.
VERSION = "0.1.0"
