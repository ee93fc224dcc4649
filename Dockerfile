# One image for web, watch, worker, beat and the migrate job (docker-compose.yml). The cluster agent has its own slim
# image: deploy/agent/Dockerfile.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
# curl: the web service's health check in docker-compose.yml.
RUN apt-get update && apt-get install -y --no-install-recommends curl && rm -rf /var/lib/apt/lists/*
# The dependencies first, read from pyproject.toml alone, so this layer is rebuilt only when they change.
COPY pyproject.toml ./
RUN python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep=chr(10))" \
      > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt
# Then the whole build context, minus what .dockerignore leaves out. Deliberately not one COPY per package:
# that hand-kept list is how gangs/ went missing (pyproject.toml gained the app, this file did not), and
# pyproject.toml already is the list of what ships. .dockerignore keeps out what must never be in an image
# (version control, local virtualenvs and databases, secrets) and what the service never runs (tests,
# benchmarks, scripts, CI, deploy/). tests/test_image.py rebuilds this file list, checks it against every
# package and package-data glob pyproject.toml ships, and runs the RUN line below on it.
COPY . .
RUN pip install --no-deps . && python manage.py collectstatic --noinput
RUN useradd --system --uid 10001 draservice
USER draservice
EXPOSE 8000 8001
# gunicorn.conf.py: gthread workers, keep-alive 75 s, graceful shutdown; see the file for the reasons.
CMD ["gunicorn", "-c", "gunicorn.conf.py", "draservice.wsgi:application", "--bind", "0.0.0.0:8000"]
