"""Routes of the jobs API, included under ``/api/v1/`` by ``config.urls``."""

from django.urls import path

from jobs import resource_views, session_views, views

app_name = "jobs"

urlpatterns = [
    path("jobs/", views.JobListCreateView.as_view(), name="jobs"),
    path("jobs/estimate/", views.JobEstimateView.as_view(), name="job-estimate"),
    path("jobs/tensorboard.zip", views.OrganizationTensorBoardView.as_view(), name="jobs-tensorboard"),
    path("jobs/<int:job_id>/", views.JobDetailView.as_view(), name="job-detail"),
    path("jobs/<int:job_id>/cancel/", views.JobCancelView.as_view(), name="job-cancel"),
    path("jobs/<int:job_id>/pause/", views.JobPauseView.as_view(), name="job-pause"),
    path("jobs/<int:job_id>/resume/", views.JobResumeView.as_view(), name="job-resume"),
    path("jobs/<int:job_id>/metrics/", views.JobMetricsView.as_view(), name="job-metrics"),
    path("jobs/<int:job_id>/events/", views.JobEventsView.as_view(), name="job-events"),
    path("jobs/<int:job_id>/artifacts/", views.JobArtifactsView.as_view(), name="job-artifacts"),
    path("jobs/<int:job_id>/tensorboard.zip", views.JobTensorBoardView.as_view(), name="job-tensorboard"),
    path("jobs/<int:job_id>/artifacts/<slug:name>.zip", views.JobArtifactArchiveView.as_view(),
         name="job-artifact-archive"),
    path("jobs/<int:job_id>/artifacts/<slug:name>/<str:filename>", views.JobArtifactFileView.as_view(),
         name="job-artifact-file"),
]

# What jobs run on (datasets, models) and where (the cluster): jobs.resource_views.
urlpatterns += [
    path("datasets/", resource_views.DatasetListCreateView.as_view(), name="datasets"),
    path("datasets/<int:dataset_id>/", resource_views.DatasetDetailView.as_view(), name="dataset-detail"),
    path("models/", resource_views.ModelListCreateView.as_view(), name="models"),
    path("models/upload/", resource_views.ModelUploadView.as_view(), name="model-upload"),
    path("models/<int:model_id>/", resource_views.ModelDetailView.as_view(), name="model-detail"),
    path("models/<int:model_id>/publish/", resource_views.ModelPublishView.as_view(), name="model-publish"),
    path("cluster/", resource_views.ClusterView.as_view(), name="cluster"),
]

# Sessions: a tenant's own loop calling the function API (jobs.session_views).
urlpatterns += [
    path("sessions/", session_views.SessionOpenView.as_view(), name="sessions"),
    path("sessions/<int:session_id>/calls/", session_views.session_calls, name="session-calls"),
    path("sessions/<int:session_id>/calls/<int:seq>/", session_views.session_call_answer, name="session-call"),
]
