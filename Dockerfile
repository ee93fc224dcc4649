# One image for web, worker, beat and the cluster agent.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
RUN apt-get update && apt-get install -y --no-install-recommends curl && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md ./
COPY draservice ./draservice
COPY dra ./dra
COPY inventory ./inventory
COPY claims ./claims
COPY frontend ./frontend
COPY agent ./agent
COPY manage.py ./
RUN pip install . && python manage.py collectstatic --noinput
RUN useradd --system --uid 10001 draservice
USER draservice
EXPOSE 8000
CMD ["gunicorn", "draservice.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "4", "--threads", "8", "--timeout", "120"]
