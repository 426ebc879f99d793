"""Routes of the jobs API, included under ``/api/v1/`` by ``config.urls``."""

from django.urls import path

from jobs import views

app_name = "jobs"

urlpatterns = [
    path("jobs/", views.JobListCreateView.as_view(), name="jobs"),
    path("jobs/<int:job_id>/", views.JobDetailView.as_view(), name="job-detail"),
    path("jobs/<int:job_id>/cancel/", views.JobCancelView.as_view(), name="job-cancel"),
    path("jobs/<int:job_id>/pause/", views.JobPauseView.as_view(), name="job-pause"),
    path("jobs/<int:job_id>/resume/", views.JobResumeView.as_view(), name="job-resume"),
    path("jobs/<int:job_id>/metrics/", views.JobMetricsView.as_view(), name="job-metrics"),
    path("jobs/<int:job_id>/events/", views.JobEventsView.as_view(), name="job-events"),
]
