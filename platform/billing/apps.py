from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"
    verbose_name = "Billing"

    def ready(self) -> None:
        from accounts.signals import plan_changed
        from billing.tasks import on_plan_changed

        plan_changed.connect(on_plan_changed, dispatch_uid="billing.on_plan_changed")
