"""Pipelines over topics (SPEC §7): ``topic("a").pipe(fn).to(topic("b"))``, DAGs of such stages
as a :class:`Pipeline`, run as Spark Structured Streaming queries (exactly-once writes), with
``dry_run`` and a Mermaid drawing. Declaring needs only this package; running needs the
``spark`` extra. CLI: ``raftbroker pipeline run|show module:attr``.
"""

from broker.pipeline.dag import Piped, Pipeline, Stage, TopicRef, as_pipeline, topic

__all__ = ["Piped", "Pipeline", "Stage", "TopicRef", "as_pipeline", "topic"]
