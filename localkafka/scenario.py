"""What every scripted scenario on one controller and its brokers leaves:
the Kafka version it ran and where Kafka's own records of it are."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from localkafka.cluster import LocalKafkaCluster
from localkafka.layout import NodeLayout


@dataclass
class ScenarioRun:
    version: str
    controller: NodeLayout
    brokers: tuple[NodeLayout, ...]

    @property
    def metadata_files(self) -> list[Path]:
        """The controller's metadata log: its snapshots, then its segments, oldest first."""
        directory = self.controller.metadata_dir
        return sorted(directory.glob("*.checkpoint")) + sorted(directory.glob("*.log"))

    @property
    def request_logs(self) -> dict[int, Path]:
        """Node id -> its request log (the controller's and every broker's)."""
        return {node.node_id: node.request_log for node in (self.controller, *self.brokers)}

    def dump_metadata(self, cluster: LocalKafkaCluster) -> str:
        """Kafka's own DumpLogSegments --cluster-metadata-decoder of the
        controller's metadata log segments (run once the cluster stopped)."""
        segments = ",".join(str(f) for f in self.metadata_files if f.suffix == ".log")
        tool = cluster.jars.dump_tool_class
        return cluster.run_tool(tool, "--cluster-metadata-decoder", "--files", segments)
