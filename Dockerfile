# One image for every role of the VIPS service; docker-compose.yml picks the role by its command:
#   vips serve --host 0.0.0.0   the API (control database + broker only)
#   vips worker                 a Celery worker: the only role given the sensitive database's URL
#   vips migrate all            Alembic migrations of both databases
FROM python:3.11-slim AS build
# A C compiler for the wheel's one compiled module (privacy_wall/noise/_discrete_gaussian.pyx): build stage only
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md alembic.ini ./
COPY privacy_wall ./privacy_wall
COPY worker ./worker
COPY control ./control
COPY service ./service
COPY vips ./vips
COPY migrations ./migrations
RUN pip install --no-cache-dir --upgrade pip \
 && pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    VIPS_HOME=/var/lib/vips
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl \
 && rm -rf /wheels \
 && useradd --system --create-home --home-dir /var/lib/vips vips \
 && chmod 700 /var/lib/vips  # the server-side verbs refuse a store others can read
# Alembic reads its script folders from the working directory (vips.migrate), so they ship beside it.
WORKDIR /opt/vips
COPY alembic.ini ./
COPY migrations ./migrations
USER vips
EXPOSE 8000
ENTRYPOINT ["vips"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
