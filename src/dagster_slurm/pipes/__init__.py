"""Dagster Pipes plumbing: the context file sent with the job and the message reader.

* :class:`PipesDeferredFileContextInjector` serialises the context for a file the caller
  writes in its submission request.
* :class:`PipesTailMessageReader` tails the payload's messages, stdout and stderr files
  through a :class:`FileSource` (:class:`AgentFileSource` on the cluster,
  :class:`LocalFileSource` on this machine).

Wiring, in this order::

    injector = PipesDeferredFileContextInjector(f"{job_dir}/context.json")
    reader = PipesTailMessageReader(
        AgentFileSource(client),
        f"{job_dir}/messages.jsonl",
        stdout_path=f"{job_dir}/stdout.txt",   # the job's --output
        stderr_path=f"{job_dir}/stderr.txt",   # the job's --error
    )
    with open_pipes_session(context, injector, reader, extras=extras) as session:
        env = session.get_bootstrap_env_vars()   # goes into the job's environment
        with client.batch() as batch:            # one round trip
            wrote = batch.add(injector.write_op(makedirs=True))
            batch.add(submit_op(...), requires=[wrote])
        ...                                      # wait for the job; reader.wake() once it runs;
        ...                                      # yield from session.get_results() meanwhile
    # leaving the block (after the job ended) stops the reader and drains the files
    yield from session.get_results()
"""

from dagster_slurm.pipes.context import PipesDeferredFileContextInjector
from dagster_slurm.pipes.reader import PipesTailMessageReader, ReaderStats
from dagster_slurm.pipes.sources import AgentFileSource, FileSource, LocalFileSource

__all__ = [
    "AgentFileSource",
    "FileSource",
    "LocalFileSource",
    "PipesDeferredFileContextInjector",
    "PipesTailMessageReader",
    "ReaderStats",
]
