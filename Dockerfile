# The fencewatch image: the `fencewatch` command (job, simulator, shippers,
# webhook receiver) and, from the pyspark wheel, Spark's standalone master and
# worker (`spark-class org.apache.spark.deploy.master.Master`). docker-compose.yml
# builds it as fencewatch:local.
FROM python:3.11-slim-bookworm

# Spark 4 needs Java 17 or 21. The man directory works around the JRE package's
# post-install step on slim images, which have none.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*

# Spark starts its Python workers with PYSPARK_PYTHON, on every node.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYSPARK_PYTHON=/usr/local/bin/python3 \
    PYSPARK_DRIVER_PYTHON=/usr/local/bin/python3

WORKDIR /opt/fencewatch
COPY pyproject.toml README.md ./
COPY detectors ./detectors
COPY producers ./producers
COPY streaming ./streaming
COPY webhooks ./webhooks
COPY localkafka ./localkafka
COPY probe ./probe
COPY incidents ./incidents
COPY lab ./lab
COPY fencewatch ./fencewatch
RUN pip install . \
    && fencewatch --help > /dev/null \
    && java -version

# An unprivileged user owns the directories that compose mounts named volumes
# on (a fresh volume takes the ownership of the directory it is mounted on).
RUN useradd --create-home --uid 10001 --user-group fencewatch \
    && mkdir -p /var/lib/fencewatch/checkpoint /var/lib/fencewatch/outbox /var/lib/fencewatch/truth \
       /var/lib/fencewatch/ship \
       /etc/fencewatch \
    && chown -R fencewatch:fencewatch /var/lib/fencewatch
USER fencewatch
WORKDIR /home/fencewatch

EXPOSE 9464
CMD ["fencewatch", "--help"]
