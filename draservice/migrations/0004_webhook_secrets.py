"""Every queue webhook gets a Standard Webhooks secret (``whsec_<base64 key>``).

* No secret (such webhooks were signed with an empty key, which anyone can forge): one is generated, and a
  ``SecretGenerated`` webhook event says so. The secret is not shown anywhere: the queue's admin sets one
  they know (PATCH ``spec.preemption.webhook.secret``) for their receiver to verify notices again.
* A secret of the old kind (any string): it becomes ``whsec_`` + the base64 of its bytes, the same HMAC key;
  a ``SecretConverted`` event says so (receivers now verify the Standard Webhooks headers with it).
"""
import base64
import secrets

from django.db import migrations


def forwards(apps, schema_editor):
    Queue = apps.get_model("queues", "Queue")
    WebhookEvent = apps.get_model("draservice", "WebhookEvent")
    for queue in Queue.objects.all():
        hook = (queue.spec.get("preemption") or {}).get("webhook") or {}
        if not hook.get("url") or str(hook.get("secret") or "").startswith("whsec_"):
            continue
        owner = f"queue/{queue.name}"
        if hook.get("secret"):
            hook["secret"] = "whsec_" + base64.b64encode(hook["secret"].encode()).decode()
            WebhookEvent.objects.create(owner=owner, reason="SecretConverted", message=(
                "notices are now signed the Standard Webhooks way (webhook-id, webhook-timestamp, webhook-signature "
                "headers); the secret is now whsec_ followed by the base64 of the old secret: the same key"))
        else:
            hook["secret"] = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
            WebhookEvent.objects.create(owner=owner, reason="SecretGenerated", message=(
                "the webhook had no secret (its notices could be forged): a secret was generated, and notices are "
                "signed with it; set one you know with PATCH spec.preemption.webhook.secret (whsec_<base64>)"))
        queue.spec["preemption"]["webhook"] = hook
        queue.save(update_fields=["spec"])


class Migration(migrations.Migration):

    dependencies = [
        ("draservice", "0003_webhook_deliveries"),
        ("queues", "0003_preemption"),
    ]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
